"""Architecture configs of the models a recipe names (:func:`find_config`: a local folder, a shipped
``recipes/configs/<name>/`` or the Hugging Face cache, never a download) and their parameter counts
(:func:`architecture`: built on the meta device, in PEFT's LoRA as training does; remote-code types counted
from their config fields).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from medadapt.errors import ConfigError
from medadapt.models import ALIASES
from medadapt.plan.specs import LoraSpec, ModelSpec

__all__ = ["Architecture", "architecture", "config_dirs", "find_config"]

#: model families whose MLP is gated (SwiGLU / GeGLU: gate, up and down projections)
_GATED = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "new", "phi3"}
#: families whose RMSNorm is written in Python (autograd keeps input, normalised input and output)
_RMS = {"llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3"}
#: families with per-head RMSNorms on Q and K
_QK_NORM = {"qwen3", "gemma3_text"}


def config_dirs(recipe_source: str | None = None) -> list[Path]:
    """Folders searched for ``<name>/config.json``: ``$MEDADAPT_PLAN_CONFIGS`` (``os.pathsep``-separated),
    the recipe file's ``configs/`` folder, and the ``recipes/configs`` of this source tree."""
    dirs = [Path(p) for p in os.environ.get("MEDADAPT_PLAN_CONFIGS", "").split(os.pathsep) if p]
    if recipe_source:
        dirs.append(Path(recipe_source).resolve().parent / "configs")
    dirs.append(Path(__file__).resolve().parents[2] / "recipes" / "configs")
    return list(dict.fromkeys(dirs))


def find_config(model: str, recipe_source: str | None = None) -> tuple[dict, str]:
    """``(config dict, where it came from)`` for a recipe's model name; downloads nothing."""
    local = None
    if model.lower() in ALIASES:
        local = ALIASES[model.lower()]()
    elif Path(model).expanduser().is_dir():
        local = Path(model).expanduser()
    if local is not None:
        path = local / "config.json"
        if not path.is_file():
            raise ConfigError(f"model folder {local} has no config.json")
        return _read(path), str(path)
    name = model.rstrip("/").split("/")[-1]
    for folder in config_dirs(recipe_source):
        path = folder / name / "config.json"
        if path.is_file():
            return _read(path), str(path)
    try:  # already in the Hugging Face cache (a model used before); never a download
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(model, "config.json", local_files_only=True))
        return _read(path), str(path)
    except Exception:  # noqa: BLE001 - any miss means "not available offline"
        pass
    where = ", ".join(str(d) for d in config_dirs(recipe_source))
    raise ConfigError(f"no architecture config for model {model!r}: put its published config.json in "
                      f"<dir>/{name}/config.json under one of: {where} (or name a local model folder)")


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{path}: a config.json needs a 'model_type'")
    return data


@dataclass(frozen=True)
class Architecture:
    """The numbers the memory model needs: ``total_params`` as trained (layers kept and added, LoRA, heads),
    ``trainable_params``; ``lora_in_features`` / ``lora_targets``: input widths / count of one layer's LoRA
    linears."""

    model: str
    source: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    gated_mlp: bool
    hidden_dropout: float
    attention_dropout: float
    total_params: int
    trainable_params: int
    rms_norm: bool = False
    qk_norm: bool = False
    lora_in_features: int = 0
    lora_targets: int = 0
    lora_groups: frozenset = frozenset()  # which of attn_in / attn_out / mlp_in / mlp_out LoRA wraps
    built_on_meta: bool = True

    @property
    def frozen_params(self) -> int:
        return self.total_params - self.trainable_params


def _first(cfg: dict, *keys, default=None):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return default


def architecture(spec: ModelSpec, *, trains: bool = True, recipe_source: str | None = None) -> Architecture:
    """The :class:`Architecture` of ``spec`` (``trains=False``: nothing of it is trainable)."""
    cfg, source = find_config(spec.model, recipe_source)
    cfg = dict(cfg)
    if spec.num_layers is not None:
        n = _first(cfg, "num_hidden_layers", "n_layer", "num_layers")
        if n is not None and not 1 <= spec.num_layers <= n:
            raise ConfigError(f"{spec.role}: num_layers must be in [1, {n}] for {spec.model}, got {spec.num_layers}")
        cfg["num_hidden_layers"] = spec.num_layers
    hidden = int(_first(cfg, "hidden_size", "n_embd", "d_model"))
    heads = int(_first(cfg, "num_attention_heads", "n_head"))
    layers = int(_first(cfg, "num_hidden_layers", "n_layer"))
    common = dict(
        model=spec.model, source=source, model_type=cfg["model_type"], hidden=hidden,
        intermediate=int(_first(cfg, "intermediate_size", "n_inner", default=4 * hidden)), layers=layers + spec.extra_layers,
        heads=heads, kv_heads=int(_first(cfg, "num_key_value_heads", default=heads)),
        head_dim=int(_first(cfg, "head_dim", default=hidden // heads)),
        gated_mlp=cfg["model_type"] in _GATED, rms_norm=cfg["model_type"] in _RMS,
        qk_norm=cfg["model_type"] in _QK_NORM,
        hidden_dropout=float(_first(cfg, "hidden_dropout_prob", "hidden_dropout", "resid_pdrop", default=0.0)),
        attention_dropout=float(_first(cfg, "attention_probs_dropout_prob", "attention_dropout", "attn_pdrop",
                                       default=0.0)),
    )
    try:
        counts = _meta_counts(cfg, spec, trains)
        built = True
    except (ValueError, KeyError, ImportError) as exc:  # a model_type transformers cannot build here
        if cfg["model_type"] not in _ANALYTIC:
            raise ConfigError(f"{spec.model}: cannot build model_type {cfg['model_type']!r} on the meta device "
                              f"({exc}) and no analytic count is known for it") from None
        counts = _analytic_counts(cfg, spec, trains, common)
        built = False
    total, trainable, lora_in, lora_n, groups = counts
    return Architecture(**common, total_params=total + spec.head_params,
                        trainable_params=trainable + (spec.head_params if trains else 0),
                        lora_in_features=lora_in, lora_targets=lora_n, lora_groups=groups, built_on_meta=built)


def _layer_list(model):
    """The model's largest ``nn.ModuleList`` (its transformer layers)."""
    from torch import nn

    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m)]
    return max(lists, key=len) if lists else None


def _meta_counts(cfg: dict, spec: ModelSpec, trains: bool) -> tuple[int, int, int, int, frozenset]:
    import logging

    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    kwargs = {k: v for k, v in cfg.items() if k not in {"model_type", "architectures", "auto_map",
                                                         "transformers_version", "torch_dtype"}}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity(logging.ERROR)
    try:
        config = AutoConfig.for_model(cfg["model_type"], **kwargs)
        with init_empty_weights():
            model = AutoModel.from_config(config)
    finally:
        hf_logging.set_verbosity(level)
    layers = _layer_list(model)
    per_layer = sum(p.numel() for p in layers[0].parameters()) if layers is not None else 0
    total = sum(p.numel() for p in model.parameters()) + spec.extra_layers * per_layer
    if not trains:
        return total, 0, 0, 0, frozenset()
    if spec.lora is None:
        return total, total, 0, 0, frozenset()
    return _lora_counts(model, spec.lora, total, len(layers) if layers is not None else 1)


def _lora_counts(model, lora: LoraSpec, total: int, n_layers: int) -> tuple[int, int, int, int]:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules) if lora.target_modules else None)
    try:
        peft_model = get_peft_model(model, config)
    except ValueError as exc:
        raise ConfigError(f"LoRA target_modules {lora.target_modules}: {exc}") from None
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    from peft.tuners.lora import LoraLayer

    wrapped = [(name, m) for name, m in peft_model.named_modules() if isinstance(m, LoraLayer)]
    in_features = sum(m.in_features for _, m in wrapped)
    groups = frozenset(_group(name) for name, _ in wrapped)
    return (total + trainable, trainable, in_features // max(n_layers, 1), len(wrapped) // max(n_layers, 1),
            groups)


#: where a linear sits in a layer, by the end of its qualified name (Llama / Qwen / Gemma / Mistral,
#: GPT-NeoX, BERT); anything else counts as every group (the conservative choice)
_GROUPS = (("attn_out", ("o_proj", "attention.dense", "attention.output.dense", "out_proj", "attn.c_proj")),
           ("attn_in", ("q_proj", "k_proj", "v_proj", "query", "key", "value", "query_key_value", "qkv_proj",
                        "Wqkv", "c_attn")),
           ("mlp_in", ("gate_proj", "up_proj", "up_gate_proj", "dense_h_to_4h", "intermediate.dense", "fc1",
                       "c_fc")),
           ("mlp_out", ("down_proj", "dense_4h_to_h", "output.dense", "fc2", "mlp.c_proj")))


def _group(name: str) -> str:
    for group, suffixes in _GROUPS:
        if any(name == s or name.endswith("." + s) for s in suffixes):
            return group
    return "all"


# model types counted from their config fields (transformers cannot build them without remote code)
_ANALYTIC = {"new"}


def _analytic_params(cfg: dict) -> tuple[int, int]:
    """``(total, per layer)`` parameters of model type ``new`` (gte-v1.5 / gte-multilingual remote code) from
    its config: embeddings and LayerNorm; per layer packed QKV, output projection, gated MLP (``h x 2I``, no
    bias) and ``I x h``, two LayerNorms. gte-multilingual-base: 305,368,320 (the published 305M)."""
    h, i = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
    n = int(cfg["num_hidden_layers"])
    emb = int(cfg["vocab_size"]) * h + int(cfg.get("type_vocab_size") or 0) * h + 2 * h
    if cfg.get("position_embedding_type", "absolute") == "absolute":
        emb += int(cfg["max_position_embeddings"]) * h
    layer = (h * 3 * h + 3 * h) + (h * h + h) + (h * 2 * i) + (i * h + h) + 4 * h
    return emb + n * layer, layer


def _analytic_counts(cfg, spec: ModelSpec, trains: bool, common: dict) -> tuple[int, int, int, int, frozenset]:
    total, layer = _analytic_params(cfg)
    total += spec.extra_layers * layer
    if not trains:
        return total, 0, 0, 0, frozenset()
    if spec.lora is None:
        return total, total, 0, 0, frozenset()
    raise ConfigError(f"{spec.model}: LoRA on model_type {cfg['model_type']!r} needs transformers to build it; "
                      "use a local model folder")
