"""Layer-pruned query tower: the first ``n`` layers of the document encoder (KALE, Campos et al. 2023;
CARE Appendix C.2 keeps 3 layers of Qwen3-4B), so the query tower starts inside the document encoder's space.
Hand-written: neither sentence-transformers nor transformers prunes a loaded model."""

from __future__ import annotations

import copy

from sentence_transformers.base.modules import Transformer
from torch import nn

from medadapt.errors import ConfigError

__all__ = ["layer_list", "prune_layers"]


def layer_list(hf_model: nn.Module) -> nn.ModuleList:
    """The transformer-block ``ModuleList`` of a Hugging Face model: the one whose length is
    ``config.num_hidden_layers``."""
    n = getattr(getattr(hf_model, "config", None), "num_hidden_layers", None)
    candidates = [m for _, m in hf_model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if n is None or not candidates:
        raise ConfigError(f"cannot find the transformer layers of {type(hf_model).__name__} to prune")
    return candidates[0]


def prune_layers(model, n_layers: int):
    """A deep copy of ``model`` keeping the first ``n_layers`` layers of its first module (a
    ``Transformer``), with the config cut to match (``num_hidden_layers``, per-layer lists), so it saves and
    reloads as an ordinary smaller model."""
    pruned = copy.deepcopy(model)
    first = pruned[0]
    if not isinstance(first, Transformer):
        raise ConfigError(f"can only prune a Transformer module, got {type(first).__name__}")
    hf = first.auto_model
    layers = layer_list(hf)
    if not 1 <= n_layers <= len(layers):
        raise ConfigError(f"n_layers must be in [1, {len(layers)}], got {n_layers}")
    del layers[n_layers:]
    config = hf.config
    config.num_hidden_layers = n_layers
    for key in ("layer_types", "mlp_only_layers"):
        value = getattr(config, key, None)
        if isinstance(value, list) and len(value) > n_layers:
            setattr(config, key, value[:n_layers])
    return pruned
