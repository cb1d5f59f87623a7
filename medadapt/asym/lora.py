"""LoRA on the document tower of an asymmetric model (CARE: document encoders fine-tuned with LoRA, r=32).

``SentenceTransformer.add_adapter`` only reaches the *first* ``Transformer`` of a model, which inside a
``Router`` is not necessarily the document tower, so the adapter is attached explicitly: the document route's
``Transformer.model`` is wrapped with PEFT's ``get_peft_model``. Only the LoRA matrices of the document tower
train; the query tower is untouched by this call. :func:`merge_document_lora` folds the adapter into the
weights (``merge_and_unload``) so the saved model is a plain folder that loads without PEFT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from medadapt.errors import ConfigError

__all__ = [
    "DocumentLoraConfig",
    "attach_document_lora",
    "attach_lora_to",
    "document_transformer",
    "enable_gradient_checkpointing_on",
    "has_lora",
    "merge_document_lora",
    "merge_lora_in",
]


@dataclass
class DocumentLoraConfig:
    """PEFT ``LoraConfig`` fields used for the document tower (CARE Appendix C.3: ``r=32``).

    Attributes:
        r: LoRA rank.
        alpha: LoRA scaling numerator (``lora_alpha``).
        dropout: dropout on the LoRA branch.
        target_modules: module names to adapt; ``None`` lets PEFT pick its default for the architecture
            (``q_proj``/``v_proj`` for Llama/Qwen, ``query``/``value`` for BERT).
    """

    r: int = 32
    alpha: int = 64
    dropout: float = 0.05
    target_modules: list[str] | None = field(default=None)

    def to_peft(self):
        """The equivalent ``peft.LoraConfig``."""
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=self.target_modules)


def document_transformer(model):
    """The ``Transformer`` module that starts the document route of an asymmetric model."""
    from sentence_transformers.base.modules import Transformer

    from medadapt.asym.model import route_modules

    first = route_modules(model, "document")[0]
    if not isinstance(first, Transformer):
        raise ConfigError(f"the document route starts with {type(first).__name__}, not a Transformer; "
                          "LoRA needs one")
    return first


def has_lora(module) -> bool:
    """True if any parameter of ``module`` belongs to a LoRA adapter."""
    return any("lora_" in name for name, _ in module.named_parameters())


def enable_gradient_checkpointing_on(transformer) -> None:
    """Activation checkpointing in a ``Transformer`` module's Hugging Face model (non-reentrant, so LoRA and
    frozen embeddings still get gradients)."""
    hf = transformer.model
    if not hasattr(hf, "gradient_checkpointing_enable"):
        raise ConfigError(f"{type(hf).__name__} does not support gradient checkpointing")
    hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if hasattr(hf, "enable_input_require_grads"):
        hf.enable_input_require_grads()


def attach_lora_to(transformer, config: DocumentLoraConfig, *, gradient_checkpointing: bool = False,
                   what: str = "the model"):
    """Wrap a ``Transformer`` module's Hugging Face model with a PEFT LoRA adapter, in place; returns the
    PEFT model (shared by CARE's document route and BMRetriever)."""
    from peft import get_peft_model

    if has_lora(transformer):
        raise ConfigError(f"{what} already has a LoRA adapter")
    if gradient_checkpointing:
        enable_gradient_checkpointing_on(transformer)
    transformer.model = get_peft_model(transformer.model, config.to_peft())
    return transformer.model


def merge_lora_in(transformer) -> bool:
    """Fold a ``Transformer`` module's LoRA adapter into its weights (``merge_and_unload``); ``False`` if
    it has none."""
    from peft import PeftModel

    if not isinstance(transformer.model, PeftModel):
        return False
    transformer.model = transformer.model.merge_and_unload()
    return True


def attach_document_lora(model, config: DocumentLoraConfig | None = None, *,
                         gradient_checkpointing: bool = False):
    """Wrap the document tower's transformer with a PEFT LoRA adapter, in place; returns the PEFT model.

    Afterwards only the LoRA matrices of the document tower have ``requires_grad`` among document-tower
    parameters (the query tower's flags are not changed).
    """
    return attach_lora_to(document_transformer(model), config or DocumentLoraConfig(),
                          gradient_checkpointing=gradient_checkpointing, what="the document tower")


def merge_document_lora(model) -> bool:
    """Fold the document tower's LoRA adapter into its weights (``merge_and_unload``); ``False`` if none."""
    return merge_lora_in(document_transformer(model))
