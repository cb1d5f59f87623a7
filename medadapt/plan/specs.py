"""What a system's ``plan`` tells the planner about a recipe: the models it holds and the phases that train
them. All sizes are global (the recipe's ``batch_size`` is split over the processes, as the trainers do), except
a phase's ``batch_size`` when it is ``per_device``.
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
    """One network of a recipe: ``role`` (the name the phases use), ``model`` (hub id, folder or alias; ``None``
    for a head of ``head_params`` parameters), trained through ``lora`` (else fully, when it trains)."""

    role: str
    model: str | None
    lora: LoraSpec | None = None
    torch_dtype: str | None = None  # None: float32
    gradient_checkpointing: bool = False
    num_layers: int | None = None  # keep only the first layers; None: all
    extra_layers: int = 0  # copies of the last layer beside the model (e.g. a lexicon encoder)
    head_params: int = 0  # trainable parameters outside the transformer (projectors, heads)
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"  # sdpa stores no seq x seq matrix


@dataclass(frozen=True)
class Usage:
    """How one phase uses one model: ``texts`` sequences of ``seq_len`` tokens per example; ``trains``: gradients
    flow through it (activations, gradients, optimizer state); every model of the plan costs its weights in
    every phase."""

    role: str
    texts: int
    seq_len: int
    trains: bool = True


@dataclass(frozen=True)
class PhaseSpec:
    """One training phase: ``batch_size`` examples per forward pass (global; with ``per_device``, on each
    device) and ``gradient_accumulation_steps`` forward passes per optimizer step, as the recipe declares them."""

    name: str
    batch_size: int
    gradient_accumulation_steps: int = 1
    uses: tuple[Usage, ...] = ()
    embedding_dim: int = 0  # width of the embeddings GradCache keeps for the whole optimizer step
    #: activations per example outside the transformers of ``uses`` (e.g. RetroMAE's MLM logits), bytes
    extra_bytes_per_example: float = 0.0
    #: ``batch_size`` is per device (HyReC's ``batch_size_scope: per_device``): N devices train N times as many
    per_device: bool = False

    @property
    def global_batch(self) -> int:
        """Examples per optimizer step as declared (on each device when ``per_device``)."""
        return self.batch_size * self.gradient_accumulation_steps

    def batch_on(self, devices: int) -> int:
        """Examples per optimizer step over ``devices`` devices (the paper's global batch)."""
        return self.global_batch * (devices if self.per_device else 1)


@dataclass(frozen=True)
class PlanSpec:
    """A recipe as the planner sees it: its networks, its phases, the precision it declares."""

    recipe: str
    models: tuple[ModelSpec, ...]
    phases: tuple[PhaseSpec, ...]
    mixed_precision: str = "no"
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: the system's trainer accumulates gradients under DeepSpeed (medadapt's loop does so under DDP and FSDP only)
    engine_accumulation: bool = False
    #: separate optimisers the loop trains the recipe with (None: one per phase; DeepSpeed takes only one)
    optimizers: int | None = None
    #: lines on the data the recipe builds before training, shown by ``medadapt plan``
    data: tuple[str, ...] = field(default_factory=tuple)
