"""Global-Local-Aware Encoder (HyReC §3.1.1-3.1.3, Appendix A) for any BERT-like backbone.

An encoder of ``L`` layers is split at ``L - N``: embeddings + first ``L - N`` layers are the semantic
sharing backbone (eq. 1); the last ``N`` layers are the local-aware dense encoder (eq. 3) and a deep copy of
them the global-aware lexicon encoder (eq. 2), both from the same weights (Appendix A). The dense encoder
stays the backbone's own layers, so backbone + dense encoder remain an ordinary sentence-transformers
model. ``num_layers`` / ``lexicon_layers`` (off by default) and the ``frozen`` variant: docs/hyrec.md.
Hand-written: no library splits an encoder this way.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["truncate_layers", "encoder_layers", "extended_mask", "run_layers", "split_layers", "embed",
           "Variant"]

Variant = Literal["full", "frozen"]


def encoder_layers(auto_model: nn.Module) -> nn.ModuleList:
    """The transformer layer list of a BERT-like model (BERT, RoBERTa, XLM-R, ELECTRA: ``encoder.layer``)."""
    enc = getattr(auto_model, "encoder", None)
    layers = getattr(enc, "layer", None) if enc is not None else None
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(f"{type(auto_model).__name__} is not BERT-like (no encoder.layer list); "
                          "GLAE needs a BERT / RoBERTa / XLM-R style encoder")
    return layers


def split_layers(auto_model: nn.Module, n_branch: int, n_lexicon: int | None = None
                 ) -> tuple[list[nn.Module], list[nn.Module], nn.ModuleList]:
    """``(shared, dense, lexicon)``: the first ``L - n_branch`` layers, the last ``n_branch`` (shared with the
    backbone, the dense encoder) and a deep copy of the first ``n_lexicon`` of those (the lexicon encoder;
    default all ``n_branch``, the paper's symmetric split)."""
    layers = encoder_layers(auto_model)
    n = len(layers)
    if not 1 <= n_branch <= n:
        raise ConfigError(f"branch_layers must be in [1, {n}] for a {n}-layer backbone, got {n_branch}")
    shared = list(layers[: n - n_branch])
    dense = list(layers[n - n_branch :])
    n_lexicon = n_branch if n_lexicon is None else n_lexicon
    if not 1 <= n_lexicon <= n_branch:
        raise ConfigError(f"lexicon_layers must be in [1, {n_branch}], got {n_lexicon}")
    lexicon = nn.ModuleList(copy.deepcopy(layer) for layer in dense[:n_lexicon])
    return shared, dense, lexicon


def truncate_layers(auto_model: nn.Module, num_layers: int) -> None:
    """Keep only the first ``num_layers`` layers of the backbone (in place)."""
    layers = encoder_layers(auto_model)
    if not 1 <= num_layers <= len(layers):
        raise ConfigError(f"num_layers must be in [1, {len(layers)}], got {num_layers}")
    auto_model.encoder.layer = nn.ModuleList(list(layers)[:num_layers])
    auto_model.config.num_hidden_layers = num_layers


def extended_mask(attention_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``(B, T)`` 0/1 mask -> additive ``(B, 1, 1, T)`` mask for the layers."""
    m = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - m) * torch.finfo(dtype).min


def run_layers(layers, hidden: Tensor, ext_mask: Tensor) -> Tensor:
    for layer in layers:
        out = layer(hidden, attention_mask=ext_mask)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def embed(auto_model: nn.Module, input_ids: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
    """Token + position (+ type) embeddings of the backbone."""
    kwargs = {"input_ids": input_ids}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = token_type_ids
    return auto_model.embeddings(**kwargs)
