"""The optimisation section every stage of the one loop trains with: one pydantic class for the Python
API and the recipes; systems with other defaults subclass it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from medadapt.config import Section

__all__ = ["OptimSection", "SchedulerKind"]

SchedulerKind = Literal["cosine", "linear", "constant"]


class OptimSection(Section):
    """AdamW + warm-up/decay schedule of one training stage.

    Attributes:
        epochs: at least 1 (to skip a stage, leave it out: ``enabled: false`` / ``null``).
        batch_size: items per forward pass, global (split over processes).
        gradient_accumulation_steps: forward passes per optimiser step; the loss sees the whole effective batch
            (GradCache), so ``k`` steps of ``b`` train exactly as one of ``k * b``, with the memory of ``b``.
        lr: peak learning rate (at most 10: larger values overflow float32 optimiser steps).
        weight_decay: on matrices only.
        scheduler: decay after warm-up (``transformers.get_scheduler``)."""

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
