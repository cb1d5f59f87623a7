"""One optimiser step, shared by every medadapt training loop (heads, CARE stages)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


def optimizer_step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, scheduler: Any,
                   params: Iterable[torch.nn.Parameter], max_grad_norm: float | None,
                   accelerator: Any | None = None, *, loss_scale: float = 1.0,
                   sync_gradients: Callable[[], None] | None = None) -> float:
    """Backward of ``loss_scale * loss`` (through ``accelerator`` when given), optional gradient
    synchronisation, optional gradient-norm clipping, optimiser and scheduler step. Returns the learning
    rate the step used.

    Args:
        loss_scale: multiplies the loss before backward; the loops pass
            :func:`~medadapt.training.distributed.gradient_scale` (the number of processes) because their
            loss is the global-batch loss computed identically on every process and the gradients are then
            averaged over processes (see :mod:`medadapt.training.distributed`).
        sync_gradients: called after backward, before clipping (the head trainer's
            :func:`~medadapt.training.distributed.average_gradients`; DDP-wrapped models need nothing).

    Clipping goes through ``accelerator.clip_grad_norm_`` when an accelerator is given (it unscales fp16
    gradients first and defers to DeepSpeed's own clipping), else ``torch.nn.utils.clip_grad_norm_``. It
    runs on gradients already averaged over processes, so every process clips by the same factor.
    """
    params = list(params)
    optimizer.zero_grad(set_to_none=True)
    scaled = loss * loss_scale if loss_scale != 1.0 else loss
    if accelerator is not None:
        accelerator.backward(scaled)
    else:
        scaled.backward()
    if sync_gradients is not None:
        sync_gradients()
    if max_grad_norm is not None:
        if accelerator is not None:
            accelerator.clip_grad_norm_(params, max_grad_norm)
        else:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    return float(lr)
