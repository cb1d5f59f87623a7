"""LoRA adapters on sentence-transformers models: the one attach / merge / gradient-checkpointing helper.

Every system that trains a backbone through LoRA uses these functions with the recipe's
:class:`~medadapt.recipes.base.LoraSection` (one set of defaults: ``r=16, alpha=32, dropout=0.05``; a
paper setting such as CARE's ``r=32`` is written in its recipe). The section is passed in (this neutral
module imports nothing from :mod:`medadapt.recipes`, which imports the training loop); anything with its
four fields ``r``, ``alpha``, ``dropout``, ``target_modules`` will do:

* CARE attaches to the document route's ``Transformer`` (:func:`medadapt.asym.attach_document_lora`),
* BMRetriever to the retriever's first ``Transformer`` (each stage attaches a fresh adapter, merges it),
* the Med-MoE-Embed slow path to the backbone's first ``Transformer``.

``SentenceTransformer.add_adapter`` only reaches the *first* ``Transformer`` of a model, which inside a
``Router`` is not necessarily the one to adapt, so the adapter is attached explicitly: the module's Hugging
Face model is wrapped with PEFT's ``get_peft_model`` (only the LoRA matrices train afterwards), and
:func:`merge_lora` folds it back (``merge_and_unload``) so a saved folder loads without PEFT.

Example:
    >>> from medadapt.recipes.base import LoraSection
    >>> attach_lora(model, LoraSection(r=8, alpha=16), gradient_checkpointing=True)
    >>> ...  # train
    >>> merge_lora(model)
"""

from __future__ import annotations

from typing import Any, Protocol

from medadapt.errors import ConfigError

__all__ = ["LoraSpec", "attach_lora", "enable_gradient_checkpointing", "first_transformer", "has_lora",
           "merge_lora", "peft_config"]


class LoraSpec(Protocol):
    """What a LoRA adapter needs: the fields of :class:`medadapt.recipes.base.LoraSection`."""

    r: int
    alpha: int
    dropout: float
    target_modules: list[str] | None


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
                      "(for an asymmetric model use medadapt.asym.attach_document_lora)")


def has_lora(module) -> bool:
    """True if any parameter of ``module`` belongs to a LoRA adapter."""
    return any("lora_" in name for name, _ in module.named_parameters())


def peft_config(lora: LoraSpec):
    """The ``peft.LoraConfig`` of a :class:`~medadapt.recipes.base.LoraSection`. ``target_modules=None``
    lets PEFT pick its default for the architecture (``q_proj`` / ``v_proj`` for Llama / Qwen, ``query`` /
    ``value`` for BERT)."""
    from peft import LoraConfig

    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                      target_modules=list(lora.target_modules) if lora.target_modules else None)


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


def attach_lora(model, lora: LoraSpec, *, gradient_checkpointing: bool = False):
    """Wrap the Hugging Face model of ``model``'s first ``Transformer`` (or of the ``Transformer`` module
    given) with a PEFT LoRA adapter, in place; returns the PEFT model.

    Afterwards only the LoRA matrices of that module have ``requires_grad`` (other modules' flags are not
    changed). A module that already has an adapter is refused (merge it first).
    """
    from peft import get_peft_model

    transformer = first_transformer(model)
    if has_lora(transformer):
        raise ConfigError(f"the {type(transformer).__name__} module already has a LoRA adapter; "
                          "merge it (merge_lora) before attaching another")
    if gradient_checkpointing:
        enable_gradient_checkpointing(transformer)
    transformer.model = get_peft_model(transformer.model, peft_config(lora))
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
