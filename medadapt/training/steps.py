"""One optimiser step, shared by every medadapt training loop (heads, CARE stages)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scheduler: Any,
                   params: Iterable[torch.nn.Parameter], max_grad_norm: float | None,
                   accelerator: Any | None = None) -> float:
    """Backward (through ``accelerator`` when given), optional gradient-norm clipping, optimiser and
    scheduler step. Returns the learning rate the step used."""
    optimizer.zero_grad(set_to_none=True)
    if accelerator is not None:
        accelerator.backward(loss)
    else:
        loss.backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    return float(lr)
