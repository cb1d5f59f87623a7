"""The optimisation loop shared by every asymmetric training stage (init, stage I, stage II).

One stage = AdamW over an explicit parameter list, warm-up + decay schedule (``transformers.get_scheduler``),
gradient clipping, optional Hugging Face Accelerate (DDP / DeepSpeed via ``accelerate launch``, mixed
precision) and atomic resumable checkpoints in medadapt's format
(:mod:`medadapt.training.checkpoint`: trainable tensors in ``head.safetensors``, optimiser + scheduler in
``optimizer.pt``, counters and loss history in ``state.json``). What a step computes is a callback, so
the loop knows nothing about towers or losses.

Determinism: epoch ``e``'s order is a permutation seeded by ``(seed, e)`` and the step index alone decides
which items a step sees, so a resumed run repeats the uninterrupted one.

Distributed (``accelerate launch --num_processes N``; :mod:`medadapt.training.distributed`): ``batch_size``
is the global batch; each process gets a contiguous shard of it (in order, so the shards concatenated are the
single-process batch). The step function embeds its shard through the prepared (DDP / DeepSpeed) model,
all-gathers the embeddings with :func:`~medadapt.training.distributed.gather_with_grad` and returns the
loss of the *global* batch, the same value on every process; the loop backpropagates ``N x loss`` so that
averaging gradients over processes gives the single-process gradient. The model is not wrapped in DDP
(a step runs it twice, once per route, and may leave trainable parameters unused, which DDP rejects);
gradients are averaged with one flat all-reduce per step
(:func:`~medadapt.training.distributed.average_gradients`) and the trainable parameters are broadcast from
the main process at the start of the stage. DeepSpeed and FSDP keep their own engines (prepared models),
which average gradients themselves. The logged loss curve therefore matches a
one-process run with the same global batch and seed (up to float rounding). Clipping sees the averaged
gradients (identical on every process); only the main process reports progress and writes checkpoints,
the others wait for it. A global batch with fewer items than processes (a tiny last batch) is skipped, its
step still counted.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint, load_checkpoint, save_checkpoint
from medadapt.training.distributed import average_gradients, broadcast_parameters, shard_bounds
from medadapt.training.steps import optimizer_step

__all__ = ["LoopConfig", "StageResult", "run_stage"]

StepFn = Callable[[nn.Module, list[int]], dict[str, Tensor]]


@dataclass
class LoopConfig:
    """Optimisation settings of one stage.

    Attributes:
        epochs: passes over the stage's items.
        max_steps: stop after this many optimiser steps (``None``: all epochs).
        batch_size: items per optimiser step (global, split over processes).
        lr: peak AdamW learning rate (CARE Table 17: 1e-4 for every stage, both towers).
        weight_decay: AdamW weight decay on matrices.
        warmup_ratio: fraction of steps in linear warm-up (Table 17: 0.05).
        scheduler: ``"cosine"``, ``"linear"`` or ``"constant"`` after warm-up.
        max_grad_norm: clip threshold (``None``: no clipping).
        seed: data order seed.
    """

    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 32
    lr: float = 1e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    scheduler: Literal["cosine", "linear", "constant"] = "cosine"
    max_grad_norm: float | None = 1.0
    seed: int = 42

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.batch_size < 1 or self.lr <= 0:
            raise ConfigError("epochs must be >= 0, batch_size >= 1 and lr > 0")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError("max_steps must be >= 1 or None")
        if self.scheduler not in ("cosine", "linear", "constant"):
            raise ConfigError(f"Unknown scheduler {self.scheduler!r}; valid: ['cosine', 'linear', 'constant']")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError("warmup_ratio must be in [0, 1)")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StageResult:
    """Outcome of :func:`run_stage`: per-step loss rows (``step``, ``epoch``, ``loss``, parts, ``lr``),
    the number of steps and the wall-clock seconds."""

    name: str
    loss_history: list[dict[str, float]] = field(default_factory=list)
    steps: int = 0
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        return self.loss_history[-1]["loss"] if self.loss_history else math.nan


def _named_trainable(model: nn.Module, params: Sequence[nn.Parameter]) -> dict[str, nn.Parameter]:
    wanted = {id(p) for p in params}
    return {name: p for name, p in model.named_parameters() if id(p) in wanted}


def run_stage(
    name: str,
    model: nn.Module,
    params: Sequence[nn.Parameter],
    n_items: int,
    step_fn: StepFn,
    config: LoopConfig,
    *,
    accelerator: Any | None = None,
    checkpoint: CheckpointConfig | None = None,
    progress: Callable[[str, int, int, dict[str, float]], None] | None = None,
) -> StageResult:
    """Run one training stage.

    Args:
        name: stage name (recorded in checkpoints and results).
        model: the module holding every parameter (passed to ``accelerator.prepare_model``; ``step_fn``
            receives the prepared one).
        params: the parameters to optimise; all others should have ``requires_grad=False``.
        n_items: number of training items; ``step_fn`` gets a list of item indices.
        step_fn: ``step_fn(model, indices) -> {part: loss}``; the loop sums the parts. ``indices`` are this
            process's contiguous shard of the global batch; under several processes the parts must be the
            global-batch loss, computed on embeddings gathered with
            :func:`~medadapt.training.distributed.gather_with_grad` (identity with one process).
        config: :class:`LoopConfig`.
        accelerator: optional ``accelerate.Accelerator`` (device, DDP, autocast, backward).
        checkpoint: optional checkpoint settings; resumes from the newest matching checkpoint.
        progress: optional callback ``(name, step, total_steps, record)``.
    """
    from transformers import get_scheduler

    params = [p for p in params if p.requires_grad]
    if not params:
        raise ConfigError(f"stage {name!r}: no trainable parameters")
    if n_items < 1:
        raise ConfigError(f"stage {name!r}: no training items")
    rank = accelerator.process_index if accelerator is not None else 0
    world = accelerator.num_processes if accelerator is not None else 1
    steps_per_epoch = math.ceil(n_items / config.batch_size)
    total = config.epochs * steps_per_epoch
    if config.max_steps is not None:
        total = min(total, config.max_steps)
    result = StageResult(name)
    start = time.perf_counter()
    named = _named_trainable(model, params)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr)
    kind = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[config.scheduler]
    scheduler = get_scheduler(kind, optimizer, num_warmup_steps=int(config.warmup_ratio * total),
                              num_training_steps=max(1, total))
    run_model = model
    sync = None
    if accelerator is not None:
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        dist_kind = str(getattr(accelerator, "distributed_type", ""))
        if plugin is not None:  # DeepSpeed needs model and optimiser prepared together, and a micro-batch size
            plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = max(1, config.batch_size // world)
            run_model, optimizer = accelerator.prepare(model, optimizer)
        elif "FSDP" in dist_kind:  # sharded parameters: FSDP reduces (averages) gradients itself
            run_model = accelerator.prepare_model(model)
            optimizer = accelerator.prepare_optimizer(optimizer)
        else:
            # No DDP wrapper: a step runs the model twice (query and document routes) and some trainable
            # parameters may be unused (e.g. BERT's pooler), both of which DDP's reducer rejects. Gradients
            # are averaged by hand instead (one flat all-reduce), after backward and before clipping.
            optimizer = accelerator.prepare_optimizer(optimizer)
            if world > 1:
                broadcast_parameters(params)
                sync = lambda: average_gradients(params)  # noqa: E731

    resume = 0
    # decided before anything is written: under several processes every process must take the same branch
    had_checkpoint = checkpoint is not None and latest_checkpoint(checkpoint.directory) is not None
    if accelerator is not None and world > 1:
        accelerator.wait_for_everyone()
    if checkpoint is not None and checkpoint.resume:
        found = latest_checkpoint(checkpoint.directory)
        if found is not None:
            tensors, opt_state, state = load_checkpoint(found)
            if (state.get("stage"), state.get("total_steps"), state.get("n_items")) != (name, total, n_items):
                raise ConfigError(f"checkpoint {found} belongs to another run or stage; "
                                  "use another folder or delete it")
            with torch.no_grad():
                for key, tensor in tensors.items():
                    named[key].copy_(tensor.to(named[key].device, named[key].dtype))
            optimizer.load_state_dict(opt_state["optimizer"])
            scheduler.load_state_dict(opt_state["scheduler"])
            resume = int(state["step"])
            result.loss_history = list(state["loss_history"])

    saved_at = [-1]

    def save(step: int) -> None:
        if checkpoint is None or saved_at[0] == step:
            return
        saved_at[0] = step
        if rank == 0:
            save_checkpoint(checkpoint, step, {k: p.detach() for k, p in named.items()},
                            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                            {"stage": name, "step": step, "total_steps": total, "n_items": n_items,
                             "loss_history": result.loss_history})
        if accelerator is not None:
            accelerator.wait_for_everyone()

    was_training = model.training
    model.train()
    step = 0
    try:
        for epoch in range(config.epochs):
            if step >= total:
                break
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + epoch)
            order = torch.randperm(n_items, generator=generator)
            for begin in range(0, n_items, config.batch_size):
                if step >= total:
                    break
                if step < resume:
                    step += 1
                    continue
                global_batch = order[begin : begin + config.batch_size]
                if len(global_batch) < world:  # some process would get no item: skip the step, count it
                    scheduler.step()
                    step += 1
                    continue
                lo, hi = shard_bounds(len(global_batch), rank, world)
                indices = global_batch[lo:hi].tolist()
                with accelerator.autocast() if accelerator is not None else contextlib.nullcontext():
                    parts = step_fn(run_model, indices)
                loss = sum(parts.values())
                lr = optimizer_step(loss, optimizer, scheduler, params, config.max_grad_norm, accelerator,
                                    loss_scale=float(world), sync_gradients=sync)
                step += 1
                record = {"step": float(step), "epoch": float(epoch), "loss": float(loss.detach()),
                          **{k: float(v.detach()) for k, v in parts.items()}, "lr": float(lr)}
                result.loss_history.append(record)
                if progress is not None and rank == 0:
                    progress(name, step, total, record)
                if checkpoint is not None and checkpoint.every_steps and step % checkpoint.every_steps == 0:
                    save(step)
        if step > resume or not had_checkpoint:
            save(step)
    finally:
        model.train(was_training)
    result.steps = step
    result.seconds = time.perf_counter() - start
    return result
