"""Train a head on cached (frozen-backbone) embeddings, with the Med-MoE-Embed two-step schedule.

The backbone is frozen, so its raw pooled embeddings (taken *before* ``Normalize``) can be computed once and
cached; training the head then needs no transformer forward passes. The same head maps queries and
documents (symmetric), both sides are L2-normalised inside the InfoNCE loss, exactly as the attached head
followed by ``Normalize`` does at inference.

Schedule (paper §III-D), for a :class:`~medadapt.heads.MoEHead`:

1. ``shared``: ``shared_epochs`` epochs training only the shared experts; routing is ``"off"`` so the routed
   experts, gate and alpha are neither used nor updated (the paper pre-trains shared experts separately and
   loads them into the MoE; training them in place is equivalent and keeps one object).
2. ``random``: ``random_routing_epochs`` epochs on all parameters with random routing (warm-up that feeds
   every routed expert).
3. ``learned``: ``epochs`` epochs on all parameters with the learned top-k gate.

Stages 2-3 share one optimiser and one learning-rate schedule; stage 1 has its own. Stage 2 is skipped for
heads without routed experts (nothing to route); stage 1 is skipped for heads without shared experts. Any
other head (a sentence-transformers module mapping ``features["sentence_embedding"]``) is trained on all its
parameters for ``epochs`` epochs.

Loss per step: ``InfoNCE`` (in-batch + hard negatives) ``+ LoadBalanceLoss(load_balance_weight)`` on the
head's load-balancing loss. Deterministic for a given ``seed`` (global RNG state is forked, not modified):
each epoch's data order is seeded by ``(seed, epoch)`` and random routing is re-seeded at every step, so
a run resumed from a checkpoint reproduces the uninterrupted run.

Distributed (``accelerate launch --num_processes N``, see :mod:`medadapt.training.distributed`): every
global batch is split into contiguous shards, one per process; each process maps its shard through the
head, then all-gathers queries, positives, hard negatives and the router's probabilities / assignments
(gradients kept for the local rows), so InfoNCE sees the whole global batch as in-batch negatives and the
Switch load-balancing loss is computed over the whole global batch, exactly as with one process. The head
is not wrapped in DDP (it is small, and stage 1 leaves routed experts unused); gradients of ``N x loss``
are averaged by hand (:func:`~medadapt.training.distributed.average_gradients`) before clipping, so every
process takes the single-process step and the logged loss curve matches the one-process run up to float
rounding. Only the main process reports progress and writes checkpoints (all processes wait for it).
Differences from one process: random routing (stage 2) draws per process, so that stage matches only in
distribution; a global batch with fewer items than processes (a tiny final batch) is skipped, its step
still counted.

Example:
    >>> result = train_head(head, q_emb, pos_emb, neg_emb, HeadTrainConfig(epochs=3))
    >>> docs = encode_with_head(head, doc_emb)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.heads.moe import MoEHead
from medadapt.losses.infonce import InfoNCELoss
from medadapt.losses.load_balance import LoadBalanceLoss
from medadapt.losses.load_balance import switch_load_balance
from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint, load_checkpoint, save_checkpoint
from medadapt.training.distributed import (
    average_gradients,
    broadcast_parameters,
    gather_with_grad,
    shard_bounds,
    shard_sizes,
    sum_across_processes,
)
from medadapt.training.steps import optimizer_step

__all__ = [
    "HeadTrainConfig",
    "TrainProgress",
    "TrainResult",
    "train_head",
    "encode_with_head",
    "SchedulerKind",
]

SchedulerKind = Literal["cosine", "linear", "constant"]


@dataclass
class HeadTrainConfig:
    """Hyper-parameters of :func:`train_head`.

    Attributes:
        epochs: epochs of the final stage (learned gating; the only stage for non-MoE heads).
        shared_epochs: epochs of stage 1 (shared experts only).
        random_routing_epochs: epochs of stage 2 (random-routing warm-up).
        batch_size: queries per step; each brings its positive and its hard negatives.
        lr: peak AdamW learning rate.
        weight_decay: AdamW weight decay, applied to matrices only (not biases, scalars such as alpha).
        temperature: InfoNCE temperature.
        load_balance_weight: weight of the Switch load-balancing loss.
        scheduler: learning-rate decay after warm-up, per optimiser: ``"cosine"`` / ``"linear"`` to 0, or
            ``"constant"``.
        warmup_ratio: fraction of each optimiser's steps spent in linear warm-up.
        max_grad_norm: gradient-norm clipping threshold (``None`` disables clipping).
        seed: seeds shuffling, random routing and anything else random during training.
        device: torch device to train on.
    """

    epochs: int = 3
    shared_epochs: int = 1
    random_routing_epochs: int = 1
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.01
    temperature: float = 0.05
    load_balance_weight: float = 0.01
    scheduler: SchedulerKind = "cosine"
    warmup_ratio: float = 0.05
    max_grad_norm: float | None = 1.0
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if min(self.epochs, self.shared_epochs, self.random_routing_epochs) < 0:
            raise ConfigError("epochs, shared_epochs and random_routing_epochs must be >= 0")
        if self.batch_size < 1 or self.lr <= 0 or self.temperature <= 0:
            raise ConfigError("batch_size must be >= 1, lr and temperature > 0")
        if self.weight_decay < 0 or self.load_balance_weight < 0:
            raise ConfigError("weight_decay and load_balance_weight must be >= 0")
        if self.scheduler not in get_args(SchedulerKind):
            raise ConfigError(f"Unknown scheduler {self.scheduler!r}; valid: {list(get_args(SchedulerKind))}")
        if not 0 <= self.warmup_ratio < 1:
            raise ConfigError(f"warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ConfigError("max_grad_norm must be > 0 or None")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeadTrainConfig:
        """Build from a plain dict; unknown keys raise :class:`~medadapt.errors.ConfigError`."""
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise ConfigError(f"Unknown HeadTrainConfig key(s) {unknown}; valid keys: {valid}")
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class TrainProgress:
    """Passed to the ``progress`` callback after every optimiser step.

    Attributes:
        stage: ``"shared"``, ``"random"`` or ``"learned"``.
        epoch: epoch index within the stage (0-based).
        step: global step (1-based) and ``total_steps`` over all stages.
        losses: the step's loss parts (``loss``, ``infonce``, ``load_balance``) and ``lr``.
    """

    stage: str
    epoch: int
    step: int
    total_steps: int
    losses: dict[str, float]


@dataclass
class TrainResult:
    """Outcome of :func:`train_head`.

    Attributes:
        loss_history: one dict per step: ``step``, ``epoch`` (global), ``loss``, ``infonce``,
            ``load_balance``, ``lr``.
        seconds: wall-clock training time.
        stage_steps: number of steps run in each stage, in order (history rows are in the same order).
        routing_stats: the head's routing statistics over the last stage (empty for non-MoE heads).
    """

    loss_history: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    stage_steps: dict[str, int] = field(default_factory=dict)
    routing_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def final_loss(self) -> float:
        return self.loss_history[-1]["loss"] if self.loss_history else math.nan


@dataclass(frozen=True)
class _Stage:
    name: str
    epochs: int
    routing: str | None  # MoEHead routing mode, None for non-MoE heads
    optimizer_group: int  # stages with the same group share an optimiser and schedule
    params: list[nn.Parameter]


def _stages(head: nn.Module, config: HeadTrainConfig) -> list[_Stage]:
    if not isinstance(head, MoEHead):
        return [_Stage("learned", config.epochs, None, 1, [p for p in head.parameters() if p.requires_grad])]
    groups = head.parameter_groups()
    everything = [p for p in head.parameters() if p.requires_grad]
    has_router = head.router is not None
    stages = []
    if groups["shared"] and config.shared_epochs:
        shared = [p for p in groups["shared"] if p.requires_grad]
        stages.append(_Stage("shared", config.shared_epochs, "off", 0, shared))
    if has_router and config.random_routing_epochs:
        stages.append(_Stage("random", config.random_routing_epochs, "random", 1, everything))
    if config.epochs:
        stages.append(_Stage("learned", config.epochs, "learned" if has_router else "off", 1, everything))
    return [s for s in stages if s.params]


def _lr_factor(kind: SchedulerKind, warmup: int, total: int) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total - warmup)
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def _optimizer(params: list[nn.Parameter], config: HeadTrainConfig) -> torch.optim.AdamW:
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    param_groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW([g for g in param_groups if g["params"]], lr=config.lr)


def _check_inputs(query_emb: Tensor, pos_emb: Tensor, neg_emb: Tensor | None) -> None:
    if query_emb.dim() != 2 or query_emb.shape != pos_emb.shape:
        raise ValueError(f"query_emb and pos_emb must be (N, d); got {query_emb.shape}, {pos_emb.shape}")
    if neg_emb is not None and (
        neg_emb.dim() != 3 or neg_emb.shape[0] != query_emb.shape[0] or neg_emb.shape[2] != query_emb.shape[1]
    ):
        raise ValueError(f"neg_emb must be (N, n, d) matching query_emb; got {tuple(neg_emb.shape)}")
    if query_emb.shape[0] == 0:
        raise ValueError("no training pairs")


def train_head(
    head: nn.Module,
    query_emb: Tensor,
    pos_emb: Tensor,
    neg_emb: Tensor | None = None,
    config: HeadTrainConfig | None = None,
    progress: Callable[[TrainProgress], None] | None = None,
    *,
    checkpoint: CheckpointConfig | None = None,
    accelerator: Any | None = None,
) -> TrainResult:
    """Train ``head`` in place on cached raw backbone embeddings (see module docstring).

    Runs on Hugging Face Accelerate: pass an ``accelerate.Accelerator`` (the recipe runner does; under
    ``accelerate launch`` each process takes a contiguous shard of every global batch, embeddings are
    gathered so the loss is the global-batch loss, and gradients are averaged; module docstring), or leave
    ``None`` for a plain single-device loop on ``config.device``. ``config.batch_size`` is the global batch.

    Resumable: with ``checkpoint``, the head, optimiser and scheduler states plus the step counter and loss
    history are saved atomically every ``checkpoint.every_steps`` steps and at each stage end; a later call
    with the same arguments continues from the newest checkpoint. Data order (per-epoch permutations seeded
    by ``(seed, epoch)``) and random routing (re-seeded every step) are functions of the step, so a resumed
    run reproduces the uninterrupted one.

    Args:
        head: a :class:`~medadapt.heads.MoEHead` or any module mapping ``features["sentence_embedding"]``.
        query_emb: ``(N, d)`` raw (un-normalised) query embeddings.
        pos_emb: ``(N, d)`` raw embeddings of each query's positive document.
        neg_emb: optional ``(N, n, d)`` raw hard-negative embeddings.
        config: :class:`HeadTrainConfig` (defaults if ``None``).
        progress: optional callback receiving a :class:`TrainProgress` after every step.
        checkpoint: optional :class:`~medadapt.training.checkpoint.CheckpointConfig`.
        accelerator: optional ``accelerate.Accelerator``.

    Returns:
        :class:`TrainResult` with the per-step loss history (including steps run before a resume).
    """
    config = config or HeadTrainConfig()
    _check_inputs(query_emb, pos_emb, neg_emb)
    device = accelerator.device if accelerator is not None else torch.device(config.device)
    rank = accelerator.process_index if accelerator is not None else 0
    world = accelerator.num_processes if accelerator is not None else 1
    is_main = rank == 0
    query_emb, pos_emb = query_emb.float(), pos_emb.float()
    neg_emb = None if neg_emb is None else neg_emb.float()
    n_pairs = query_emb.shape[0]
    steps_per_epoch = math.ceil(n_pairs / config.batch_size)
    stages = _stages(head, config)
    total_steps = sum(s.epochs for s in stages) * steps_per_epoch
    infonce = InfoNCELoss(config.temperature)
    load_balance = LoadBalanceLoss(config.load_balance_weight)
    is_moe = isinstance(head, MoEHead)
    original_routing = head.routing if is_moe else None
    original_scale = head.residual_scale if is_moe else None
    if is_moe:
        head.residual_scale = 1.0  # learn the full-strength correction; the configured scale applies after
    was_training = head.training
    result = TrainResult()
    start = time.perf_counter()
    head.to(device).train()
    if world > 1:
        broadcast_parameters(head.parameters())  # replicas start identical (what DDP would do)
    routing = _RoutingCapture(head) if is_moe and head.router is not None else None

    resume_step, resume_optimizer = 0, None
    if checkpoint is not None and checkpoint.resume:
        found = latest_checkpoint(checkpoint.directory)
        if found is not None:
            head_state, resume_optimizer, state = load_checkpoint(found)
            if state.get("total_steps") != total_steps or state.get("n_pairs") != n_pairs:
                raise ConfigError(
                    f"checkpoint {found} belongs to a different run ({state.get('total_steps')} steps over "
                    f"{state.get('n_pairs')} pairs, this run: {total_steps} over {n_pairs}); "
                    "use another output folder or delete the checkpoints"
                )
            head.load_state_dict(head_state)
            resume_step = int(state["step"])
            result.loss_history = list(state["loss_history"])
            result.stage_steps = dict(state["stage_steps"])

    step = 0
    epoch_offset = 0
    optimizer: torch.optim.AdamW | None = None
    scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
    current_group = None

    def save(stage_index: int) -> None:
        if checkpoint is None or step <= resume_step and step != total_steps:
            return
        if is_main:
            save_checkpoint(
                checkpoint, step, head.state_dict(),
                {"group": current_group, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                {"step": step, "stage": stage_index, "total_steps": total_steps, "n_pairs": n_pairs,
                 "loss_history": result.loss_history, "stage_steps": result.stage_steps},
            )
        if accelerator is not None:
            accelerator.wait_for_everyone()

    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for stage_index, stage in enumerate(stages):
                if stage.optimizer_group != current_group:
                    current_group = stage.optimizer_group
                    group_steps = steps_per_epoch * sum(
                        s.epochs for s in stages if s.optimizer_group == current_group
                    )
                    group_params = [p for s in stages if s.optimizer_group == current_group for p in s.params]
                    optimizer = _optimizer(list({id(p): p for p in group_params}.values()), config)
                    warmup = int(config.warmup_ratio * group_steps)
                    scheduler = torch.optim.lr_scheduler.LambdaLR(
                        optimizer, _lr_factor(config.scheduler, warmup, group_steps)
                    )
                    if resume_optimizer is not None and resume_optimizer["group"] == current_group:
                        optimizer.load_state_dict(resume_optimizer["optimizer"])
                        scheduler.load_state_dict(resume_optimizer["scheduler"])
                if is_moe:
                    head.set_routing(stage.routing)
                    head.reset_routing_stats()
                for epoch in range(stage.epochs):
                    global_epoch = epoch_offset + epoch
                    if step + steps_per_epoch <= resume_step:  # whole epoch done before the resume point
                        step += steps_per_epoch
                        continue
                    order = torch.randperm(n_pairs, generator=torch.Generator().manual_seed(
                        config.seed * 1_000_003 + global_epoch))
                    for batch_start in range(0, n_pairs, config.batch_size):
                        if step < resume_step:
                            step += 1
                            continue
                        # random routing: one seeded draw per step for the GLOBAL batch, each process takes its
                        # rows (with one process this is exactly the draw the router itself would make)
                        torch.manual_seed(config.seed * 1_000_003 + step)
                        global_index = order[batch_start : batch_start + config.batch_size]
                        if len(global_index) < world:  # not every process would get an item: skip, count
                            scheduler.step()
                            step += 1
                            continue
                        lo, hi = shard_bounds(len(global_index), rank, world)
                        sizes = shard_sizes(len(global_index), world)
                        with accelerator.autocast() if accelerator is not None else contextlib.nullcontext():
                            noise = _routing_noise(head, len(global_index), lo, hi, neg_emb, device)
                            parts = _step_losses(head, routing, global_index[lo:hi], sizes, query_emb, pos_emb,
                                                 neg_emb, device, infonce, load_balance, noise)
                        loss = sum(parts.values())
                        lr = optimizer_step(loss, optimizer, scheduler, stage.params, config.max_grad_norm,
                                            loss_scale=float(world),
                                            sync_gradients=lambda: average_gradients(stage.params))
                        step += 1
                        record = {
                            "step": float(step),
                            "epoch": float(global_epoch),
                            "loss": float(loss.detach()),
                            **{name: float(value.detach()) for name, value in parts.items()},
                            "lr": float(lr),
                        }
                        result.loss_history.append(record)
                        if progress is not None and is_main:
                            progress(TrainProgress(stage.name, epoch, step, total_steps, record))
                        if checkpoint is not None and checkpoint.every_steps and step % checkpoint.every_steps == 0:
                            save(stage_index)
                epoch_offset += stage.epochs
                result.stage_steps[stage.name] = stage.epochs * steps_per_epoch
                save(stage_index)
    finally:
        if routing is not None:
            routing.remove()
        if is_moe:
            head.set_routing(original_routing)
            head.residual_scale = original_scale
        head.train(was_training)
    if is_moe and head.router is not None and world > 1:
        _merge_routing_stats(head)
    result.routing_stats = head.routing_stats() if is_moe else {}
    result.seconds = time.perf_counter() - start
    return result


class _RoutingCapture:
    """Keeps the router's last :class:`~medadapt.heads.routing.RoutingDecision` (forward hook on
    ``head.router``), so the trainer can compute the load-balancing loss over the global batch."""

    def __init__(self, head: MoEHead) -> None:
        self.decision: Any | None = None
        self._handle = head.router.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        self.decision = output

    def take(self) -> Any | None:
        decision, self.decision = self.decision, None
        return decision

    def remove(self) -> None:
        self._handle.remove()


def _merge_routing_stats(head: MoEHead) -> None:
    """Sum the per-process routing counters so ``head.routing_stats()`` describes every process's inputs."""
    router = head.router
    router.running_counts.copy_(sum_across_processes(router.running_counts))
    seen = sum_across_processes(torch.tensor([float(router.inputs_seen)], device=router.running_counts.device))
    router.inputs_seen = int(seen.item())


def _routing_noise(head: nn.Module, batch: int, lo: int, hi: int, neg_emb: Tensor | None,
                   device: torch.device) -> Tensor | None:
    """This process's rows of one uniform draw over the global batch's head inputs, laid out as the single
    process lays them out (queries, positives, negatives), so random routing is the same on 1 or N
    processes. ``None`` unless the head routes randomly."""
    if not isinstance(head, MoEHead) or head.router is None or head.routing != "random":
        return None
    n_neg = 0 if neg_emb is None else neg_emb.shape[1]
    noise = torch.rand((batch * (2 + n_neg), head.router.num_experts), device=device)
    blocks = [noise[lo:hi], noise[batch + lo : batch + hi]]
    if n_neg:
        blocks.append(noise[2 * batch + lo * n_neg : 2 * batch + hi * n_neg])
    return torch.cat(blocks)


def _step_losses(
    head: nn.Module,
    routing: _RoutingCapture | None,
    index: Tensor,
    sizes: list[int],
    query_emb: Tensor,
    pos_emb: Tensor,
    neg_emb: Tensor | None,
    device: torch.device,
    infonce: InfoNCELoss,
    load_balance: LoadBalanceLoss,
    routing_noise: Tensor | None = None,
) -> dict[str, Tensor]:
    """One forward pass of ``head`` over this process's queries, positives and negatives together, then the
    loss parts of the *global* batch: embeddings (and router probabilities / assignments) are gathered
    from every process (``sizes``: every process's number of queries; identity with one process)."""
    queries = query_emb[index].to(device)
    positives = pos_emb[index].to(device)
    blocks = [queries, positives]
    if neg_emb is not None:
        negatives = neg_emb[index].to(device)
        blocks.append(negatives.reshape(-1, negatives.shape[-1]))
    features = {"sentence_embedding": torch.cat(blocks)}
    if routing_noise is not None:
        features["routing_noise"] = routing_noise
    mapped = head(features)["sentence_embedding"].float()
    batch = queries.shape[0]
    mapped_neg = None
    if neg_emb is not None:
        mapped_neg = gather_with_grad(mapped[2 * batch :].reshape(batch, -1, mapped.shape[-1]), sizes)
    parts = infonce(gather_with_grad(mapped[:batch], sizes), gather_with_grad(mapped[batch : 2 * batch], sizes),
                    mapped_neg)
    decision = routing.take() if routing is not None else None
    if decision is not None:
        rows_per_query = 2 + (0 if neg_emb is None else neg_emb.shape[1])
        row_sizes = [s * rows_per_query for s in sizes]
        aux = switch_load_balance(gather_with_grad(decision.probs, row_sizes),
                                  gather_with_grad(decision.selected, row_sizes))
        parts.update(load_balance(aux))
    else:
        aux = getattr(head, "last_aux_loss", None)
        if aux is not None:
            parts.update(load_balance(aux.to(device)))
    return parts


@torch.no_grad()
def encode_with_head(head: nn.Module, emb: Tensor, batch_size: int = 1024) -> Tensor:
    """Apply ``head`` then L2 normalisation to cached raw embeddings ``(N, d)``, in eval mode, batch by
    batch. Returns a float32 tensor on ``emb``'s device; the head's train/eval mode is restored."""
    was_training = head.training
    head.eval()
    device = next(head.parameters()).device
    try:
        outputs = []
        for start in range(0, emb.shape[0], batch_size):
            block = emb[start : start + batch_size].to(device=device, dtype=torch.float32)
            mapped = head({"sentence_embedding": block})["sentence_embedding"]
            outputs.append(torch.nn.functional.normalize(mapped, dim=-1).to(emb.device))
        return torch.cat(outputs) if outputs else emb.new_zeros((0, emb.shape[-1]), dtype=torch.float32)
    finally:
        head.train(was_training)
