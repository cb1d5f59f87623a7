"""LoRA adapters on sentence-transformers models: the one attach / merge / gradient-checkpointing helper.
The chosen ``Transformer`` module's Hugging Face model is wrapped with PEFT's ``get_peft_model`` explicitly,
because ``SentenceTransformer.add_adapter`` only reaches the first ``Transformer`` (inside a ``Router`` not
necessarily the one to adapt); :func:`merge_lora` folds it back so a saved folder loads without PEFT."""

from __future__ import annotations

from typing import Any

import torch

from medadapt.errors import ConfigError, warn
from medadapt.training.distributed import fsdp_requested

__all__ = ["attach_lora", "enable_gradient_checkpointing", "first_transformer", "has_lora", "merge_lora"]


def first_transformer(model) -> Any:
    """``model`` itself when it is a ``Transformer`` module, else the first ``Transformer`` module
    of the SentenceTransformer ``model``."""
    from sentence_transformers.base.modules import Transformer

    if isinstance(model, Transformer):
        return model
    for module in getattr(model, "_modules", {}).values():
        if isinstance(module, Transformer):
            return module
    raise ConfigError(f"{type(model).__name__} has no Transformer module to adapt with LoRA "
                      "(for an asymmetric model use medadapt.care.attach_document_lora)")


def has_lora(module) -> bool:
    """True if any parameter of ``module`` belongs to a LoRA adapter."""
    return any("lora_" in name for name, _ in module.named_parameters())


def enable_gradient_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing in the Hugging Face model of
    :func:`first_transformer` (so LoRA matrices and frozen embeddings still get gradients)."""
    hf = first_transformer(model).model
    if not hasattr(hf, "gradient_checkpointing_enable"):
        raise ConfigError(f"{type(hf).__name__} does not support gradient checkpointing")
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(hf, "enable_input_require_grads"):
        hf.enable_input_require_grads()


def attach_lora(model, lora, *, gradient_checkpointing: bool = False):
    """Wrap the Hugging Face model of :func:`first_transformer` with a LoRA adapter of ``lora`` in place;
    returns the PEFT model. Only its LoRA matrices then require gradients; ``target_modules=None`` is PEFT's
    default for the architecture; a module that has an adapter already is refused. Under FSDP a half-precision
    model is upcast to float32 (FSDP flattens one dtype per module; PEFT keeps LoRA in float32)."""
    from peft import LoraConfig, get_peft_model

    transformer = first_transformer(model)
    if has_lora(transformer):
        raise ConfigError(f"the {type(transformer).__name__} module already has a LoRA adapter; "
                          "merge it (merge_lora) before attaching another")
    if gradient_checkpointing:
        enable_gradient_checkpointing(transformer)
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules) if lora.target_modules else None)
    transformer.model = get_peft_model(transformer.model, config)
    dtypes = {p.dtype for p in transformer.model.parameters()}
    if len(dtypes) > 1 and fsdp_requested():
        half = sorted(str(d).replace("torch.", "") for d in dtypes if d != torch.float32)
        warn(f"FSDP flattens parameters of one dtype: the {'/'.join(half)} weights under the float32 LoRA matrices "
             "are upcast to float32 (FSDP's mixed precision still computes in bf16); load the model in float32 "
             "(torch_dtype: float32) to skip the half-precision copy")
        transformer.model.float()
    return transformer.model


def merge_lora(model) -> bool:
    """Fold the LoRA adapter of :func:`first_transformer` into its weights; ``False`` when there is none."""
    from peft import PeftModel

    transformer = first_transformer(model)
    if not isinstance(transformer.model, PeftModel):
        return False
    transformer.model = transformer.model.merge_and_unload()
    return True
