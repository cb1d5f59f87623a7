"""The one training loop of medadapt, on Hugging Face Accelerate.

Every system trains as a list of :class:`Stage` objects, each with a :class:`Step` (``forward``: per-item
outputs; ``loss``: named parts on the whole step). The loop does the rest alike for all: sharded global batches
with gathered outputs, GradCache accumulation, mixed precision, AdamW (decay on matrices only), clipping, a
stop at a non-finite loss, atomic checkpoints with exact resume. Hand-written because Accelerate has no
contrastive-aware accumulation or multi-stage schedule. See docs/training.md."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn

from medadapt.errors import ConfigError, MedAdaptError, warn
from medadapt.training.checkpoint import (CheckpointConfig, CheckpointCorruptError, all_checkpoints,
                                          latest_checkpoint, load_checkpoint, save_checkpoint)
from medadapt.training.config import OptimSection
from medadapt.training.distributed import (average_gradients, broadcast_parameters, fsdp_outside_modules,
                                           gather_with_grad, is_distributed, shard_bounds,
                                           use_fsdp_wrap_policy)

__all__ = ["Batch", "LoopResult", "Stage", "Step", "TrainingError", "check_finite_parameters", "train"]


class TrainingError(MedAdaptError):
    """Training cannot go on (a non-finite loss, a checkpoint of another run)."""


@dataclass(frozen=True)
class Batch:
    """What one forward pass works on: this process's items of this chunk (``indices``), every item of the
    optimiser step in loss order (``all_indices``), the 0-based step over all stages, the epoch within the stage
    and the run's seed (derive any random draw from ``seed`` and ``step``)."""

    indices: list[int]
    all_indices: list[int]
    step: int
    epoch: int
    seed: int


class Step(Protocol):
    """A system's training step: ``forward`` maps a batch to per-item output tensors (dim 0 = items, with
    gradients); ``loss`` maps the outputs of the whole step (gathered, in ``all_indices`` order) to named parts."""

    def forward(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]: ...

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]: ...


@dataclass
class Stage:
    """One training stage.

    Attributes:
        params: parameters trained in this stage, or parameter groups (``{"params": [...], "lr": x}``).
        schedule: stages with the same (non-``None``) name share one optimiser and schedule (the first one's
            ``optim``).
        on_start / on_end: called when the stage starts (also when a resume lands inside it) / ends.
        batches: the global batches of epoch ``e`` (item indices, a deterministic function of ``e``) for a
            sampler of the system's own; ``None``: a seeded permutation cut into effective batches."""

    name: str
    n_items: int
    step: Step
    params: Sequence[nn.Parameter] | Sequence[dict[str, Any]]
    optim: OptimSection
    schedule: str | None = None
    on_start: Callable[[], None] | None = None
    on_end: Callable[[], None] | None = None
    batches: Callable[[int], Sequence[Sequence[int]]] | None = None

    def steps(self) -> int:
        if self.batches is not None:
            total = sum(len(self.batches(e)) for e in range(self.optim.epochs))
        else:
            total = math.ceil(self.n_items / self.optim.effective_batch_size) * self.optim.epochs
        return min(total, self.optim.max_steps) if self.optim.max_steps else total


@dataclass
class LoopResult:
    """Per-step rows (``stage``, ``step``, ``epoch``, ``loss``, its parts, ``lr``), steps per stage and
    the seconds of this call (a resumed run keeps the earlier rows)."""

    loss_history: list[dict[str, Any]] = field(default_factory=list)
    stage_steps: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def steps(self) -> int:
        return sum(self.stage_steps.values())

    @property
    def final_loss(self) -> float:
        return float(self.loss_history[-1]["loss"]) if self.loss_history else math.nan


def _param_groups(params, optim: OptimSection, covered: set[int]) -> list[dict[str, Any]]:
    """AdamW groups of ``params`` (parameters or ``{"params", "lr"}`` groups) not yet in ``covered``: weight
    decay on matrices only."""
    groups = list(params)
    out = []
    for g in groups if groups and isinstance(groups[0], dict) else [{"params": groups}]:
        ps = [p for p in g["params"] if p.requires_grad and id(p) not in covered]
        covered.update(id(p) for p in ps)
        lr = g.get("lr", optim.lr)
        out.append({"params": [p for p in ps if p.ndim >= 2], "weight_decay": optim.weight_decay, "lr": lr})
        out.append({"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0, "lr": lr})
    return [g for g in out if g["params"]]


class _Schedule:
    """One optimiser + scheduler, shared by the stages of a schedule group."""

    def __init__(self, stages: list[Stage], accelerator, model: nn.Module, world: int,
                 wrapped: dict[str, Any] | None = None):
        from transformers import get_scheduler

        optim = stages[0].optim
        covered: set[int] = set()
        groups = [g for s in stages for g in _param_groups(s.params, optim, covered)]
        self.params = params = [p for g in groups for p in g["params"]]
        self.optimizer = torch.optim.AdamW(groups, lr=optim.lr)
        total = sum(s.steps() for s in stages)
        kind = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[optim.scheduler]
        self.scheduler = get_scheduler(kind, self.optimizer, num_warmup_steps=int(optim.warmup_ratio * total),
                                       num_training_steps=max(1, total))
        self.run_model = model
        self.sync: Callable[[], None] | None = None
        self.engine = self.fsdp = False
        wrapped = {} if wrapped is None else wrapped
        if accelerator is not None:
            if _engine(accelerator) == "deepspeed":  # DeepSpeed prepares model and optimiser together
                plugin = accelerator.state.deepspeed_plugin
                plugin.deepspeed_config["train_micro_batch_size_per_gpu"] = max(1, optim.batch_size // world)
                self.run_model, self.optimizer = accelerator.prepare(model, self.optimizer)
                self.engine = True
            elif _engine(accelerator) == "fsdp":  # FSDP shards parameters and reduces gradients itself
                if "fsdp" not in wrapped:  # wrap once: every schedule's optimiser holds the same parameters
                    use_fsdp_wrap_policy(accelerator, model)  # layers and trainable modules as their own units
                    wrapped["fsdp"] = accelerator.prepare_model(model)
                self.run_model = wrapped["fsdp"]
                self.optimizer = accelerator.prepare_optimizer(self.optimizer)
                self.engine = self.fsdp = True
                # FSDP leaves modules that steps call outside the forward alone: their gradients are ours
                outside = {id(p) for m in fsdp_outside_modules(model) for p in m.parameters()}
                mine = [p for p in params if id(p) in outside]
                if world > 1 and mine:
                    broadcast_parameters(mine)
                    self.sync = lambda: average_gradients(mine)
            else:
                self.optimizer = accelerator.prepare_optimizer(self.optimizer)
                if world > 1:
                    broadcast_parameters(params)  # replicas start identical (what DDP would do)
                    self.sync = lambda: average_gradients(params)

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


def _engine(accelerator) -> str | None:
    """``"deepspeed"``, ``"fsdp"`` or ``None`` (plain processes) for the run's Accelerator."""
    if accelerator is None:
        return None
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return "deepspeed"
    return "fsdp" if "FSDP" in str(getattr(accelerator, "distributed_type", "")) else None


def _check_deepspeed(model: nn.Module, groups: dict[str, list[Stage]], ids: set[int]) -> None:
    """Refuse, before any step, what DeepSpeed cannot run: several optimisers, trainable
    parameters outside the optimiser, and GradCache accumulation (its chunk backwards bypass the engine)."""
    accumulating = [s.name for members in groups.values() for s in members
                    if s.optim.gradient_accumulation_steps > 1]
    if accumulating:
        raise ConfigError(f"gradient_accumulation_steps > 1 (stages: {', '.join(accumulating)}) is not supported "
                          "under DeepSpeed; raise the per-process batch, or launch with DDP "
                          "(recipes/accelerate/multi-gpu.yaml) or FSDP (recipes/accelerate/fsdp.yaml)")
    if len(groups) > 1:
        names = [", ".join(s.name for s in members) for members in groups.values()]
        raise ConfigError(f"DeepSpeed prepares one model with one optimizer, but this run trains with {len(groups)} "
                          f"separate optimizers (stages: {'; '.join(names)}); launch it with DDP "
                          "(recipes/accelerate/multi-gpu.yaml) or FSDP (recipes/accelerate/fsdp.yaml)")
    loose = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in ids]
    if loose:
        raise ConfigError(f"DeepSpeed needs every trainable parameter in the optimizer, but {len(loose)} are not "
                          f"trained by any stage ({', '.join(loose[:3])}...): freeze them (requires_grad=False) "
                          "or launch with DDP / FSDP")


def _release(sch: _Schedule) -> None:
    """Free the optimiser state and gradients of a schedule whose last stage has ended, so later phases
    do not carry them on the device (DeepSpeed keeps its state inside the engine)."""
    if sch.engine and not sch.fsdp:
        return
    sch.optimizer.state.clear()
    for p in sch.params:
        p.grad = None


def _gather(outputs: dict[str, Tensor], world: int = 1) -> dict[str, Tensor]:
    """Every process's outputs, in rank order; the local slice's gradient is scaled by ``world``, so the
    average of the processes' gradients is the global batch's (parameters the loss reads directly, such as a
    learnable temperature, keep their plain gradient)."""
    def one(v: Tensor) -> Tensor:
        if world > 1 and v.requires_grad:
            v = v.view_as(v)
            v.register_hook(lambda grad: grad * float(world))
        return gather_with_grad(v)

    return {k: one(v) if isinstance(v, Tensor) else v for k, v in outputs.items()}


def _cat(chunks: list[dict[str, Tensor]]) -> dict[str, Tensor]:
    if len(chunks) == 1:
        return chunks[0]
    return {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _check_finite(parts: dict[str, Tensor], loss: Tensor, stage: str, step: int) -> None:
    if not bool(torch.isfinite(loss.detach()).all()):
        bad = [k for k, v in parts.items() if not bool(torch.isfinite(v.detach()).all())]
        raise TrainingError(f"stage {stage!r}, step {step + 1}: the loss is not finite (parts: {', '.join(bad)}); "
                            "nothing was saved for this step: lower the learning rate or check the data")


def _readable_checkpoint(directory: Path):
    """``(path, head_state, optimizer_state, state)`` of the newest checkpoint that reads back intact; an
    unreadable one (truncated, altered) is skipped with a warning and the one before it is used."""
    problems = []
    for path in all_checkpoints(directory):
        try:
            return (path, *load_checkpoint(path))
        except CheckpointCorruptError as exc:
            problems.append(str(exc))
            warn(f"checkpoint {exc}: unreadable, resuming from the one before it")
    raise TrainingError(f"no checkpoint in {directory} can be read ({'; '.join(problems[:3])}); pass "
                        "--overwrite to start the run afresh")


def check_finite_parameters(module: nn.Module, where: str) -> None:
    """Raise :class:`TrainingError` naming up to three non-finite parameters of ``module``
    (``where``: what would have been written). Collective: every process checks its own shards and all raise
    together."""
    def local(p: Tensor) -> Tensor:
        return p.to_local() if hasattr(p, "to_local") else p

    bad = [n for n, p in module.named_parameters()
           if p.is_floating_point() and local(p).numel() and not bool(torch.isfinite(local(p).detach()).all())]
    ok = not bad
    if is_distributed():
        cuda = dist.get_backend() == "nccl" and torch.cuda.is_available()
        flag = torch.tensor([int(ok)], dtype=torch.int32,
                            device=torch.device("cuda", torch.cuda.current_device()) if cuda else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        ok = bool(flag.item())
    if not ok:
        raise TrainingError(f"parameters are not finite ({', '.join(bad[:3]) or 'on another process'}); {where} "
                            "was not written: lower the learning rate or check the data")


def _check_finite_params(trained: dict[str, Tensor], step: int) -> None:
    bad = [n for n, p in trained.items() if not bool(torch.isfinite(p.detach()).all())]
    if bad:
        raise TrainingError(f"step {step}: parameters became non-finite ({', '.join(bad[:3])}); nothing was "
                            "saved: lower the learning rate")


def train(
    model: nn.Module,
    stages: Sequence[Stage],
    *,
    seed: int = 42,
    accelerator: Any | None = None,
    checkpoint: CheckpointConfig | None = None,
    fingerprint: str | None = None,
    progress: Callable[[str, int, int, dict[str, Any]], None] | None = None,
) -> LoopResult:
    """Train ``model`` in place through ``stages``; returns the loss history.

    Args:
        accelerator: an ``accelerate.Accelerator`` (``None``: one process on the model's device).
        checkpoint: where and how often to checkpoint; a later call with the same arguments resumes.
        fingerprint: identity of the run, stored in every checkpoint and compared on resume.
        progress: called on the main process after every step with ``(stage, step, total, row)``."""
    stages = [s for s in stages if s.steps() > 0]
    rank = accelerator.process_index if accelerator is not None else 0
    world = accelerator.num_processes if accelerator is not None else 1
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    total = sum(s.steps() for s in stages)
    result = LoopResult()
    start_time = time.perf_counter()

    groups: dict[str, list[Stage]] = {}
    for i, s in enumerate(stages):
        groups.setdefault(s.schedule or f"#{i}", []).append(s)
    if _engine(accelerator) == "deepspeed":
        covered: set[int] = set()
        for s in stages:
            _param_groups(s.params, s.optim, covered)
        _check_deepspeed(model, groups, covered)
    wrapped: dict[str, Any] = {}
    names = {id(p): n for n, p in model.named_parameters()}  # before FSDP renames the modules it wraps
    shapes = {id(p): tuple(p.shape) for p in model.parameters()}  # before FSDP flattens them
    registry = _parameter_registry(model) if _engine(accelerator) == "fsdp" else []
    schedules = {key: _Schedule(members, accelerator, model, world, wrapped) for key, members in groups.items()}
    schedule_of = {id(s): schedules[s.schedule or f"#{i}"] for i, s in enumerate(stages)}
    last_stage_of = {id(schedule_of[id(s)]): i for i, s in enumerate(stages)}  # when a schedule is done
    trained = {names[id(p)]: p for sch in schedules.values() for p in sch.params}

    resume = 0
    had_checkpoint = checkpoint is not None and latest_checkpoint(checkpoint.directory) is not None
    if accelerator is not None and world > 1:
        accelerator.wait_for_everyone()  # every process decides on the same checkpoint
    if checkpoint is not None and checkpoint.resume and had_checkpoint:
        found, tensors, opt_state, state = _readable_checkpoint(checkpoint.directory)
        if state.get("fingerprint") != fingerprint or state.get("total_steps") != total:
            raise TrainingError(
                f"checkpoint {found} belongs to another run (recipe, data or base model differ); "
                "train into a new output folder, or pass --overwrite to start this one afresh")
        missing = sorted(set(tensors) ^ set(trained))
        if missing:
            raise TrainingError(f"checkpoint {found} does not match the model's trainable parameters "
                                f"({', '.join(missing[:3])}...)")
        if "fsdp" in wrapped:  # whole tensors into FSDP's shards, optimiser states resharded by FSDP
            _fsdp_load(names, trained, tensors, schedules, opt_state)
        else:
            with torch.no_grad():
                for key, tensor in tensors.items():
                    trained[key].copy_(tensor.to(trained[key].device, trained[key].dtype))
            for key, sch in schedules.items():
                sch.load_state_dict(opt_state[key])
        resume = int(state["step"])
        result.loss_history = list(state["loss_history"])

    last_saved = [-1]

    def save(step: int) -> None:
        if checkpoint is None or last_saved[0] == step:
            return
        last_saved[0] = step
        _check_finite_params(trained, step)  # a finite loss can still leave inf weights (lr 1e308)
        if "fsdp" in wrapped:  # whole tensors and optimiser states gathered from every process's shard
            tensors, opt = _fsdp_gather(shapes, names, trained, schedules)
        else:
            tensors = {k: p.detach() for k, p in trained.items()}
            opt = {key: sch.state_dict() for key, sch in schedules.items()}
        if rank == 0:
            save_checkpoint(checkpoint, step, tensors, opt,
                            {"step": step, "total_steps": total, "fingerprint": fingerprint,
                             "loss_history": result.loss_history})
        if accelerator is not None:
            accelerator.wait_for_everyone()

    was_training = model.training
    model.train()
    autocast = accelerator.autocast if accelerator is not None else contextlib.nullcontext
    every = checkpoint.every_steps if checkpoint is not None else 0
    step = 0
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for stage_index, stage in enumerate(stages):
                n_steps, sch = stage.steps(), schedule_of[id(stage)]
                if step + n_steps <= resume:  # finished before the resume point
                    step += n_steps
                else:
                    if stage.on_start is not None:
                        stage.on_start()
                    for epoch, items in _stage_batches(stage, stage_index, seed, n_steps):
                        if step < resume:
                            step += 1
                            continue
                        torch.manual_seed(seed * 7_919 + step)
                        if len(items) < world:  # a process would get no item: count the step, skip it
                            sch.scheduler.step()
                        else:
                            row = _one_step(stage, sch, items, step, epoch, seed, rank, world, accelerator, autocast,
                                            device)
                            result.loss_history.append(row)
                            if progress is not None and rank == 0:
                                progress(stage.name, step + 1, total, row)
                        step += 1
                        if every and step % every == 0:
                            save(step)
                    _check_finite_params(trained, step)  # nothing non-finite reaches a checkpoint or the model
                    if stage.on_end is not None:
                        stage.on_end()
                    save(step)
                result.stage_steps[stage.name] = n_steps
                if last_stage_of[id(sch)] == stage_index:
                    _release(sch)
            if not stages and not had_checkpoint:
                save(0)
    finally:
        model.train(was_training)
    if "fsdp" in wrapped:
        _unwrap_fsdp(wrapped["fsdp"], registry, accelerator)
    result.seconds = time.perf_counter() - start_time
    return result


def _stage_batches(stage: Stage, stage_index: int, seed: int, n_steps: int):
    """``(epoch, items)`` of the stage's first ``n_steps`` global batches: ``stage.batches``, else a seeded
    permutation of the items cut into effective batches, epoch after epoch."""
    done, epoch, eff = 0, 0, stage.optim.effective_batch_size
    while done < n_steps:
        if stage.batches is not None:
            plan = [list(b) for b in stage.batches(epoch)]
        else:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + stage_index * 10_007 + epoch)
            order = torch.randperm(stage.n_items, generator=gen).tolist()
            plan = [order[begin: begin + eff] for begin in range(0, stage.n_items, eff)]
        plan = plan[: n_steps - done]
        for items in plan:
            yield epoch, items
        done += len(plan)
        epoch += 1


def _torch_optimizer(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # Accelerate's AcceleratedOptimizer wraps torch's


def _fsdp_gather(shapes: dict[int, tuple[int, ...]], names: dict[int, str], trained: dict[str, nn.Parameter],
                 schedules: dict[str, _Schedule]):
    """A checkpoint's tensors and optimiser states under FSDP1, whole (collective): only the trained
    parameters are gathered, so the checkpoint is the one a run without FSDP writes and either kind resumes."""
    params = list(trained.values())
    sizes = _piece_sizes(params)
    tensors = {names[id(p)]: _whole(p, n, shapes[id(p)]) for p, n in zip(params, sizes)}
    opt = {key: {"optimizer": _gather_optimizer(_torch_optimizer(sch.optimizer), shapes),
                 "scheduler": sch.scheduler.state_dict()} for key, sch in schedules.items()}
    return tensors, opt


def _world() -> tuple[int, int]:
    """``(rank, world size)`` of the running process group, ``(0, 1)`` without one."""
    if not is_distributed():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def _piece_sizes(params: list[Tensor]) -> list[list[int]]:
    """For each of ``params`` (this process's views), every process's number of elements, in rank order."""
    local = torch.tensor([p.numel() for p in params], dtype=torch.long)
    _, world = _world()
    if world == 1:
        return [[int(n)] for n in local]
    rows = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(rows, local)
    return torch.stack(rows).T.tolist()


def _whole(local: Tensor, sizes: list[int], shape: tuple[int, ...]) -> Tensor:
    """The whole tensor of ``shape`` from each process's piece (``sizes`` in rank order): FSDP1 gives each
    process one contiguous chunk of a flat parameter."""
    numel = math.prod(shape)
    if len(sizes) == 1 or all(n == numel for n in sizes):
        return local.detach().reshape(shape).clone()
    if sum(sizes) != numel:
        raise TrainingError(f"cannot reassemble a tensor of {numel} elements from FSDP pieces of {sizes}")
    padded = torch.zeros(max(sizes), dtype=local.dtype, device=local.device)
    padded[: local.numel()] = local.detach().reshape(-1)
    pieces = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(pieces, padded)
    return torch.cat([piece[:n] for piece, n in zip(pieces, sizes)]).reshape(shape)


def _piece(whole: Tensor, sizes: list[int], like: Tensor) -> Tensor:
    """This process's piece of ``whole``, shaped like its local view ``like`` (the inverse of :func:`_whole`)."""
    rank, _ = _world()
    if len(sizes) > 1 and sum(sizes) == whole.numel():
        lo = sum(sizes[:rank])
        return whole.reshape(-1)[lo: lo + like.numel()].reshape(like.shape).clone()
    return whole.reshape(like.shape).clone()


def _gather_optimizer(optimizer, shapes: dict[int, tuple[int, ...]]) -> dict[str, Any]:
    """``optimizer.state_dict()`` with every state tensor whole. Hand-written: torch's FSDP1
    optimiser-state gathering refuses a flat parameter that several optimisers own."""
    _, world = _world()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    keys = sorted({k for p in params for k in optimizer.state.get(p, {})})
    has = torch.tensor([1.0 if optimizer.state.get(p) else 0.0 for p in params])
    steps = torch.tensor([float(optimizer.state[p]["step"]) if optimizer.state.get(p, {}).get("step") is not None
                          else -1.0 for p in params])
    if world > 1:  # the same keys, flags and step counts on every process, in three collectives
        everyone: list[Any] = [None] * world
        dist.all_gather_object(everyone, keys)
        keys = sorted({k for ks in everyone for k in ks})
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX)
    sizes = _piece_sizes(params)
    state: dict[int, dict[str, Any]] = {}
    for index, p in enumerate(params):
        if not has[index]:
            continue
        mine = optimizer.state.get(p, {})
        entry: dict[str, Any] = {}
        for k in keys:
            if k == "step":
                entry[k] = torch.tensor(float(steps[index]))
            else:
                value = mine.get(k)
                piece = value if isinstance(value, Tensor) else torch.zeros(0, dtype=p.dtype, device=p.device)
                entry[k] = _whole(piece, sizes[index], shapes[id(p)])
        state[index] = entry
    return {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


def _fsdp_load(names: dict[int, str], trained: dict[str, nn.Parameter], tensors: dict[str, Tensor],
               schedules: dict[str, _Schedule], opt_state: dict[str, Any]) -> None:
    """Resume under FSDP1: each process copies its pieces of the whole checkpoint tensors into its views
    (:func:`_piece`), and cuts each optimiser state the same way."""
    params = list(trained.values())
    with torch.no_grad():
        for p, sizes in zip(params, _piece_sizes(params)):
            p.copy_(_piece(tensors[names[id(p)]].to(p.device, p.dtype), sizes, p))
    for key, sch in schedules.items():
        optimizer = _torch_optimizer(sch.optimizer)
        saved = opt_state[key]["optimizer"]
        mine = [p for g in optimizer.param_groups for p in g["params"]]
        sizes = _piece_sizes(mine)
        state = {index: {k: (v if v.ndim == 0 else _piece(v, sizes[int(index)], mine[int(index)]))
                         for k, v in entry.items()} for index, entry in saved["state"].items()}
        optimizer.load_state_dict({"state": state, "param_groups": saved["param_groups"]})
        sch.scheduler.load_state_dict(opt_state[key]["scheduler"])


def _parameter_registry(model: nn.Module) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """Every ``(module, name, parameter)`` of ``model`` as it is before FSDP wraps it."""
    return [(m, n, p) for m in model.modules() for n, p in m._parameters.items() if p is not None]


def _unwrap_fsdp(root: nn.Module, registry: list[tuple[nn.Module, str, nn.Parameter]], accelerator) -> None:
    """Give the model back as it came in after FSDP1 (torch has no unwrap): wrappers lifted, every
    parameter whole on every process as the same ``nn.Parameter`` object, FSDP's "flattened" marks and
    shadowing tensor views removed (collective)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    full: list[Tensor] = []
    with FSDP.summon_full_params(root, writeback=False):
        for module, name, _ in registry:
            full.append(getattr(module, name).detach().clone())
    for module in list(root.modules()):
        for child_name, child in list(module._modules.items()):
            if isinstance(child, FSDP):
                module._modules[child_name] = child._fsdp_wrapped_module
    from torch.distributed.fsdp._common_utils import FSDP_FLATTENED

    with torch.no_grad():
        for (module, name, param), tensor in zip(registry, full):
            param.data = tensor
            param.grad = None
            module.__dict__.pop(name, None)  # a plain-tensor view FSDP left there shadows the parameter
            module._parameters[name] = param
            if hasattr(param, FSDP_FLATTENED):  # FSDP skips (leaves unmanaged, unreduced) what it marked
                delattr(param, FSDP_FLATTENED)
    models = getattr(accelerator, "_models", None)  # Accelerate keeps what it prepared: release the wrapper
    if isinstance(models, list) and any(m is root for m in models):
        models[:] = [m for m in models if m is not root]


def _one_step(stage: Stage, sch: _Schedule, items: list[int], step: int, epoch: int, seed: int, rank: int,
              world: int, accelerator, autocast, device) -> dict[str, Any]:
    """Forward (in ``gradient_accumulation_steps`` chunks when accumulating), global loss, backward, clip,
    optimiser step."""
    n_chunks = max(1, min(stage.optim.gradient_accumulation_steps, len(items) // world))
    chunk_items = [items[a:b] for a, b in (shard_bounds(len(items), j, n_chunks) for j in range(n_chunks))]
    batches = []
    for chunk in chunk_items:
        lo, hi = shard_bounds(len(chunk), rank, world)
        batches.append(Batch(indices=chunk[lo:hi], all_indices=items, step=step, epoch=epoch, seed=seed))
    whole = Batch(indices=items, all_indices=items, step=step, epoch=epoch, seed=seed)
    sch.optimizer.zero_grad(set_to_none=True)
    if n_chunks == 1:
        with autocast():
            outputs = _gather(stage.step.forward(sch.run_model, batches[0]), world)
            parts = stage.step.loss(outputs, whole)
        loss = _total(parts)
        _check_finite(parts, loss, stage.name, step)
        _backward(loss, accelerator)
    else:
        # GradCache: outputs without graph, loss on all of them, then each chunk again with its cached grads
        states, leaves = [], []
        for b in batches:
            states.append(_rng_state(device))
            with torch.no_grad(), autocast():
                out = stage.step.forward(sch.run_model, b)
            leaves.append({n: (v.detach().requires_grad_(v.is_floating_point()) if isinstance(v, Tensor) else v)
                           for n, v in out.items()})
        after = _rng_state(device)
        with autocast():
            parts = stage.step.loss(_cat([_gather(leaf, world) for leaf in leaves]), whole)
        loss = _total(parts)
        _check_finite(parts, loss, stage.name, step)
        _backward(loss, accelerator)
        for b, state, leaf in zip(batches, states, leaves):
            _set_rng_state(state, device)
            with autocast():
                out = stage.step.forward(sch.run_model, b)
            pairs = [(out[n], leaf[n].grad) for n in out
                     if isinstance(out[n], Tensor) and out[n].requires_grad and leaf[n].grad is not None]
            if pairs:
                torch.autograd.backward([o for o, _ in pairs], [g.to(o.dtype) for o, g in pairs])
        _set_rng_state(after, device)
    if sch.sync is not None:
        sch.sync()
    if stage.optim.max_grad_norm is not None:
        if sch.fsdp and hasattr(sch.run_model, "clip_grad_norm_"):
            # FSDP's own norm over every shard (Accelerate's clip_grad_norm_ compares parameter lists with ==
            # and raises here). It covers every gradient of the model: drop those no optimiser of this
            # schedule steps, or they would enter this schedule's norm
            mine = {id(p) for p in sch.params}
            for p in sch.run_model.parameters():
                if p.grad is not None and id(p) not in mine:
                    p.grad = None
            unscale = getattr(accelerator, "unscale_gradients", None)
            if unscale is not None:  # fp16: FSDP's norm on unscaled gradients (Accelerate's clip does the same)
                unscale()
            sch.run_model.clip_grad_norm_(stage.optim.max_grad_norm)
        elif accelerator is not None:
            accelerator.clip_grad_norm_(sch.params, stage.optim.max_grad_norm)
        else:
            torch.nn.utils.clip_grad_norm_(sch.params, stage.optim.max_grad_norm)
    lr = float(sch.optimizer.param_groups[0]["lr"])
    sch.optimizer.step()
    sch.scheduler.step()
    return {"stage": stage.name, "step": step + 1, "epoch": epoch, "loss": float(loss.detach()),
            **{n: float(v.detach()) for n, v in parts.items() if n != "loss"}, "lr": lr}


def _total(parts: dict[str, Tensor]) -> Tensor:
    """The loss to back-propagate: ``parts["loss"]`` when the loss gives its own (weighted) total, else the
    sum of the parts."""
    return parts["loss"] if "loss" in parts else sum(parts.values())


def _backward(loss: Tensor, accelerator) -> None:
    if accelerator is not None:
        accelerator.backward(loss)
    else:
        loss.backward()
