"""LoRA on the document tower of an asymmetric model (CARE Appendix C.3: the document encoder is fine-tuned
with LoRA, ``r=32`` in ``recipes/care.yaml``): the one helper :mod:`medadapt.training.lora`, placed on the
``Transformer`` that starts the document route, and merged before saving so the folder loads without PEFT.
"""

from __future__ import annotations

from medadapt.care.model import route_modules
from medadapt.errors import ConfigError
from medadapt.recipes.base import LoraSection
from medadapt.training.lora import attach_lora, has_lora, merge_lora

__all__ = ["attach_document_lora", "document_transformer", "has_lora", "merge_document_lora"]


def document_transformer(model):
    """The ``Transformer`` module that starts the document route of an asymmetric model."""
    from sentence_transformers.base.modules import Transformer

    first = route_modules(model, "document")[0]
    if not isinstance(first, Transformer):
        raise ConfigError(f"the document route starts with {type(first).__name__}, not a Transformer; "
                          "LoRA needs one")
    return first


def attach_document_lora(model, lora: LoraSection | None = None, *, gradient_checkpointing: bool = False):
    """Wrap the document route's transformer with a PEFT LoRA adapter in place (``lora`` default:
    ``LoraSection()``); returns the PEFT model. Afterwards only its LoRA matrices have ``requires_grad`` among
    the document tower's parameters (the query tower's flags are not changed)."""
    return attach_lora(document_transformer(model), lora if lora is not None else LoraSection(),
                       gradient_checkpointing=gradient_checkpointing)


def merge_document_lora(model) -> bool:
    """Fold the document tower's LoRA adapter into its weights (``merge_and_unload``); ``False`` if none."""
    return merge_lora(document_transformer(model))
