"""LoRA adapters on sentence-transformers models: the one attach / merge / gradient-checkpointing helper.

CARE, BMRetriever and the Med-MoE-Embed backbone path attach through :func:`attach_lora` with any section that
has ``r``, ``alpha``, ``dropout`` and ``target_modules``. The chosen module's Hugging Face model is wrapped with
PEFT's ``get_peft_model`` explicitly, because ``SentenceTransformer.add_adapter`` only reaches the first
``Transformer`` (inside a ``Router`` not necessarily the one to adapt); :func:`merge_lora` folds it back so a
saved folder loads without PEFT.

Example:
    >>> attach_lora(model, LoraSection(r=8, alpha=16), gradient_checkpointing=True)
    >>> ...  # train
    >>> merge_lora(model)
"""

from __future__ import annotations

from typing import Any

from medadapt.errors import ConfigError, warn
from medadapt.training.distributed import fsdp_requested

__all__ = ["attach_lora", "enable_gradient_checkpointing", "first_transformer", "has_lora", "merge_lora"]


def first_transformer(model) -> Any:
    """``model`` itself when it is a sentence-transformers ``Transformer`` module, else the first
    ``Transformer`` module of the SentenceTransformer ``model`` (the one LoRA adapts)."""
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
    """Activation checkpointing in the Hugging Face model of ``model``'s first ``Transformer`` (or of the
    ``Transformer`` module given), non-reentrant so that LoRA matrices and frozen embeddings still get
    gradients."""
    hf = first_transformer(model).model
    if not hasattr(hf, "gradient_checkpointing_enable"):
        raise ConfigError(f"{type(hf).__name__} does not support gradient checkpointing")
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(hf, "enable_input_require_grads"):
        hf.enable_input_require_grads()


def attach_lora(model, lora, *, gradient_checkpointing: bool = False):
    """Wrap the Hugging Face model of ``model``'s first ``Transformer`` (or of the ``Transformer`` module
    given) with a PEFT LoRA adapter of ``lora`` (a ``LoraSection``), in place; returns the PEFT model.

    Afterwards only the LoRA matrices of that module have ``requires_grad`` (other modules' flags are not
    changed). ``target_modules=None`` lets PEFT pick its default for the architecture (``q_proj`` /
    ``v_proj`` for Llama / Qwen, ``query`` / ``value`` for BERT). A module that already has an adapter is
    refused (merge it first).

    Under FSDP (:func:`~medadapt.training.distributed.fsdp_requested`) a half-precision model is upcast to
    float32 after attaching, since FSDP flattens one dtype per module and PEFT keeps LoRA in float32; FSDP's
    mixed precision still computes in bf16.
    """
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
        import torch

        half = sorted(str(d).replace("torch.", "") for d in dtypes if d != torch.float32)
        warn(f"FSDP flattens parameters of one dtype: the {'/'.join(half)} weights under the float32 LoRA matrices "
             "are upcast to float32 (FSDP's mixed precision still computes in bf16); load the model in float32 "
             "(torch_dtype: float32) to skip the half-precision copy")
        transformer.model.float()
    return transformer.model


def merge_lora(model) -> bool:
    """Fold the LoRA adapter of ``model``'s first ``Transformer`` (or of the module given) into its
    weights (``merge_and_unload``); ``False`` when there is none."""
    from peft import PeftModel

    transformer = first_transformer(model)
    if not isinstance(transformer.model, PeftModel):
        return False
    transformer.model = transformer.model.merge_and_unload()
    return True
