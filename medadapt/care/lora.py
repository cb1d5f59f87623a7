"""LoRA on the document route of an asymmetric model (CARE Appendix C.3), through
:mod:`medadapt.training.lora`, merged before saving so the folder loads without PEFT."""

from __future__ import annotations

from sentence_transformers.base.modules import Transformer

from medadapt.care.model import route_modules
from medadapt.errors import ConfigError
from medadapt.recipes.base import LoraSection
from medadapt.training.lora import attach_lora, has_lora, merge_lora

__all__ = ["attach_document_lora", "document_transformer", "has_lora", "merge_document_lora"]


def document_transformer(model):
    """The ``Transformer`` module that starts the document route of an asymmetric model."""
    first = route_modules(model, "document")[0]
    if not isinstance(first, Transformer):
        raise ConfigError(f"the document route starts with {type(first).__name__}, not a Transformer; "
                          "LoRA needs one")
    return first


def attach_document_lora(model, lora: LoraSection | None = None, *, gradient_checkpointing: bool = False):
    """Wrap the document route's transformer with a LoRA adapter in place (default
    ``LoraSection()``); only its LoRA matrices then require gradients in that tower."""
    return attach_lora(document_transformer(model), lora if lora is not None else LoraSection(),
                       gradient_checkpointing=gradient_checkpointing)


def merge_document_lora(model) -> bool:
    """Fold the document tower's LoRA adapter into its weights; ``False`` if none."""
    return merge_lora(document_transformer(model))
