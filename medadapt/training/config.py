"""The optimisation section every hand-written stage trains with (:func:`medadapt.training.loop.train`).

One pydantic class for the Python API and the YAML recipes alike (no dataclass twin). Systems that need
other defaults (a paper's learning rate) subclass it and change the default, nothing else.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from medadapt.config import Section

__all__ = ["OptimSection", "SchedulerKind"]

SchedulerKind = Literal["cosine", "linear", "constant"]


class OptimSection(Section):
    """AdamW + warm-up/decay schedule of one training stage.

    Attributes:
        epochs: passes over the stage's items, at least 1 (a stage of 0 epochs would train nothing; to skip a
            stage, leave it out: ``enabled: false`` / ``null`` in a recipe).
        max_steps: stop after this many optimiser steps (``None``: all epochs).
        batch_size: items per forward pass, global (split over processes).
        gradient_accumulation_steps: forward passes per optimiser step. The loss is computed on all
            ``batch_size * gradient_accumulation_steps`` items at once (cached embeddings, GradCache), so
            in-batch negatives span the whole effective batch: ``k`` steps at batch ``b`` train exactly as
            one step at batch ``k * b``, with the memory of batch ``b``.
        lr: peak learning rate (at most 10: larger values overflow float32 optimiser steps).
        weight_decay: AdamW weight decay on matrices (biases, norms and scalars get none).
        warmup_ratio: fraction of the stage's steps in linear warm-up.
        scheduler: decay after warm-up (``transformers.get_scheduler``): cosine / linear to 0, or constant.
        max_grad_norm: gradient-norm clipping (``None``: off).
    """

    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(32, ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    lr: float = Field(1e-4, gt=0, le=10.0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    scheduler: SchedulerKind = "cosine"
    max_grad_norm: float | None = Field(1.0, gt=0)

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.gradient_accumulation_steps
