"""What a system tells the planner about a recipe: the models it holds and the phases that train them.

A system's ``plan`` (:class:`medadapt.systems.System`) turns its recipe into a
:class:`PlanSpec`; the planner (neutral code) never imports a system. All sizes are global (the recipe's
``batch_size`` is split over the processes, as the trainers do).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["LoraSpec", "ModelSpec", "PhaseSpec", "PlanSpec", "Usage"]


@dataclass(frozen=True)
class LoraSpec:
    """A PEFT LoRA adapter on a model (``target_modules=None``: PEFT's default for the architecture)."""

    r: int
    alpha: int
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """One network of a recipe.

    Attributes:
        role: the name the phases use (``document``, ``query``, ``backbone``, ``head``).
        model: hub id, local folder or alias; mapped to an architecture config (:mod:`medadapt.plan.configs`).
            ``None`` for a head whose size the system gives in ``head_params``.
        lora: train through LoRA (the base stays frozen); ``None``: full fine-tuning when the model trains.
        torch_dtype: dtype the weights are loaded in (``None``: float32).
        gradient_checkpointing: activation checkpointing per transformer layer.
        num_layers: keep only the first layers (HyReC's CPU / paper small model); ``None``: all.
        extra_layers: copies of the last layer added beside the model (HyReC's lexicon encoder).
        head_params: trainable parameters outside the transformer (projectors, heads).
        attn_implementation: ``sdpa`` (transformers' default: no ``seq x seq`` matrix is stored) or ``eager``.
    """

    role: str
    model: str | None
    lora: LoraSpec | None = None
    torch_dtype: str | None = None
    gradient_checkpointing: bool = False
    num_layers: int | None = None
    extra_layers: int = 0
    head_params: int = 0
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"


@dataclass(frozen=True)
class Usage:
    """How one phase uses one model: ``texts`` sequences of ``seq_len`` tokens per training example;
    ``trains``: gradients flow through it (its activations are kept for backward, its trainable
    parameters get gradients and optimizer state). A model that is present but does not train only
    costs its weights (its outputs are cached or computed without gradients); every model of the
    :class:`PlanSpec` counts as loaded in every phase (its weights), used there or not."""

    role: str
    texts: int
    seq_len: int
    trains: bool = True


@dataclass(frozen=True)
class PhaseSpec:
    """One training phase (stage) of a recipe: ``batch_size`` examples per forward pass (global) and
    ``gradient_accumulation_steps`` forward passes per optimizer step, as the recipe declares them."""

    name: str
    batch_size: int
    gradient_accumulation_steps: int = 1
    uses: tuple[Usage, ...] = ()
    embedding_dim: int = 0  # width of the embeddings GradCache keeps for the whole optimizer step
    #: activations per example outside the transformers of ``uses`` (e.g. RetroMAE's MLM logits), bytes
    extra_bytes_per_example: float = 0.0

    @property
    def global_batch(self) -> int:
        """Examples per optimizer step (the paper's global batch)."""
        return self.batch_size * self.gradient_accumulation_steps


@dataclass(frozen=True)
class PlanSpec:
    """A recipe as the planner sees it: its networks, its phases, the precision it declares."""

    recipe: str
    models: tuple[ModelSpec, ...]
    phases: tuple[PhaseSpec, ...]
    mixed_precision: str = "no"
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the system's trainer accumulates gradients under DeepSpeed (sentence-transformers' trainer does;
    #: medadapt's own loop accumulates under DDP and FSDP only, so a phase needing accumulation does not fit
    #: under DeepSpeed there)
    engine_accumulation: bool = False
    #: separate optimisers medadapt's own loop trains the recipe with (None: one per phase). DeepSpeed
    #: prepares one model with one optimiser, so more than one cannot run there (``engine_accumulation``
    #: marks sentence-transformers' trainer, which is not concerned)
    optimizers: int | None = None
    #: lines on the data the recipe builds before training (e.g. BMRetriever's synthetic data: sources,
    #: examples to keep, generation caps); shown by ``medadapt plan``, not part of the memory plan
    data: tuple[str, ...] = field(default_factory=tuple)
