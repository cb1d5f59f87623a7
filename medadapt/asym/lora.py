"""LoRA on the document tower of an asymmetric model (CARE: document encoders fine-tuned with LoRA).

The adapter itself is :mod:`medadapt.training.lora` (one helper for every system, configured by the
recipe's :class:`~medadapt.recipes.base.LoraSection`); this module only says *where* it goes in a Router
model: the ``Transformer`` that starts the document route. Only the LoRA matrices of the document tower
train; the query tower is untouched. :func:`merge_document_lora` folds the adapter into the weights so the
saved model is a plain folder that loads without PEFT. CARE Appendix C.3 uses ``r=32`` (``recipes/care.yaml``
says so; the section's defaults are ``r=16, alpha=32``).
"""

from __future__ import annotations

from medadapt.errors import ConfigError
from medadapt.recipes.base import LoraSection
from medadapt.training.lora import attach_lora, has_lora, merge_lora

__all__ = ["attach_document_lora", "document_transformer", "has_lora", "merge_document_lora"]


def document_transformer(model):
    """The ``Transformer`` module that starts the document route of an asymmetric model."""
    from sentence_transformers.base.modules import Transformer

    from medadapt.asym.model import route_modules

    first = route_modules(model, "document")[0]
    if not isinstance(first, Transformer):
        raise ConfigError(f"the document route starts with {type(first).__name__}, not a Transformer; "
                          "LoRA needs one")
    return first


def attach_document_lora(model, lora: LoraSection | None = None, *, gradient_checkpointing: bool = False):
    """Wrap the document tower's transformer with a PEFT LoRA adapter (:func:`medadapt.training.lora.
    attach_lora`; ``lora`` default: ``LoraSection()``), in place; returns the PEFT model.

    Afterwards only the LoRA matrices of the document tower have ``requires_grad`` among document-tower
    parameters (the query tower's flags are not changed).
    """
    return attach_lora(document_transformer(model), lora if lora is not None else LoraSection(),
                       gradient_checkpointing=gradient_checkpointing)


def merge_document_lora(model) -> bool:
    """Fold the document tower's LoRA adapter into its weights (``merge_and_unload``); ``False`` if none."""
    return merge_lora(document_transformer(model))
