"""What medadapt's loop promises, kept on the runs that use sentence-transformers' trainer instead.

Med-MoE-Embed with a trained backbone and BMRetriever's stages train through
``SentenceTransformerTrainer`` (Hugging Face's loop). Left alone, that loop

* trains on through a NaN / inf loss (and logs it as a filtered number: ``logging_nan_inf_filter``),
* saves ``checkpoint-N`` folders with no record of their files, and
* resumes from the newest ``checkpoint-N`` whether or not it reads back intact (a truncated file is a raw
  safetensors or torch traceback).

:func:`train_guarded` adds what :mod:`medadapt.training.loop` does on its own steps: a non-finite loss
raises :class:`~medadapt.training.loop.TrainingError` before the backward pass and optimiser step (the
processes agree through one all-reduce of a flag, so none is left waiting in a collective); parameters
that became non-finite stop the run before a checkpoint is written; every checkpoint gets a
``SHA256SUMS`` (:mod:`medadapt.checksums`) once all processes have written it; a rerun resumes from the
newest checkpoint whose sums verify, skipping damaged ones with a ``warning:`` line (a save that did not
finish is set aside), and says so plainly when every checkpoint is damaged; a checkpoint the file system
refuses to take (a full disk) is one ``cannot write checkpoint PATH: REASON`` error (the earlier
checkpoints stay; the partial one is set aside by the next run). :func:`check_finite_parameters` is the
check ``medadapt train`` runs before it writes any model folder. Hand-written because neither the trainer nor Accelerate offers these checks; they plug in
through the trainer's own callback and a forward hook on the loss, so the training itself is the
trainer's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medadapt.checksums import SUMS, ChecksumError, verify_sums, write_sums
from medadapt.errors import warn
from medadapt.training.checkpoint import WRITE_ERRORS, checkpoint_write_error
from medadapt.training.loop import TrainingError

__all__ = ["check_finite_parameters", "everyone", "non_finite_parameters", "resumable_checkpoint", "train_guarded"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _flag_device(dist) -> torch.device:
    """Where a flag tensor must live for the process group's backend (NCCL: this process's GPU)."""
    if dist.get_backend() == "nccl" and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def everyone(ok: bool) -> bool:
    """``ok`` on every process: one all-reduce (MIN) of a flag when a process group runs, else ``ok``."""
    dist = _dist()
    if dist is None:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=_flag_device(dist))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _local(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's local part; anything else unchanged."""
    return t.to_local() if hasattr(t, "to_local") else t


def non_finite_parameters(module: nn.Module, trainable_only: bool = False) -> list[str]:
    """Names of ``module``'s floating-point parameters (this process's shards) holding NaN or inf."""
    return [n for n, p in module.named_parameters()
            if (p.requires_grad or not trainable_only) and p.is_floating_point()
            and _local(p).numel() and not bool(torch.isfinite(_local(p).detach()).all())]


def check_finite_parameters(module: nn.Module, where: str) -> None:
    """Raise :class:`TrainingError` naming up to three parameters of ``module`` that hold NaN / inf
    (``where`` says what would have been written). Collective: call it on every process; each checks its
    own shards and all raise together, so none is left waiting."""
    bad = non_finite_parameters(module)
    if not everyone(not bad):
        raise TrainingError(f"parameters are not finite ({', '.join(bad[:3]) or 'on another process'}); {where} "
                            "was not written: lower the learning rate or check the data")


def _checkpoints(directory: Path) -> list[Path]:
    """``checkpoint-N`` folders of ``directory``, newest (highest ``N``) first."""
    found = [(int(m.group(1)), p) for p in directory.glob("checkpoint-*")
             if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def resumable_checkpoint(directory: str | Path) -> str | None:
    """The newest trainer checkpoint in ``directory`` whose ``SHA256SUMS`` lists every file and matches
    (``None`` when there is none to resume).

    The trainer writes ``checkpoint-N`` in place and the sums come last, so a folder **without** a
    ``SHA256SUMS`` is a save that did not finish (a kill while saving, or a checkpoint from before sums
    existed): it is moved aside as ``incomplete-checkpoint-N`` with a warning (the trainer would otherwise
    save into it again, over stale files) and the one before it is used, or the run starts afresh. A folder
    whose sums do not match is damaged: skipped with a warning; when every checkpoint is damaged the run
    stops. Call it on every process: they decide alike, and only the main process moves folders.

    Raises:
        TrainingError: there are checkpoints with sums, but none reads back intact.
    """
    from accelerate import PartialState

    directory = Path(directory)
    found = _checkpoints(directory) if directory.is_dir() else []
    chosen, damaged, incomplete = None, [], []
    for path in found:
        if not (path / SUMS).is_file():
            incomplete.append(path)
            continue
        try:
            verify_sums(path, complete=True)
        except ChecksumError as exc:
            damaged.append(f"{path.name}: {exc}")
            continue
        chosen = path
        break
    state = PartialState()
    for path in incomplete:
        warn(f"checkpoint {path.name} has no {SUMS} (its save did not finish, or it predates sums): set aside "
             f"as incomplete-{path.name}")
    state.wait_for_everyone()  # every process has decided before any folder moves
    if state.is_main_process:
        for path in incomplete:
            target = path.with_name(f"incomplete-{path.name}")
            if target.exists():
                import shutil

                shutil.rmtree(target, ignore_errors=True)
            path.replace(target)
    state.wait_for_everyone()
    for problem in damaged:
        warn(f"checkpoint {problem}; " + ("resuming from an earlier one" if chosen else "not resumed"))
    if chosen is not None:
        return str(chosen)
    if damaged:
        raise TrainingError(f"no checkpoint in {directory} reads back intact ({'; '.join(damaged[:2])}); pass "
                            "--overwrite to start the run afresh")
    return None


def _callback():
    from transformers import TrainerCallback

    class _Guard(TrainerCallback):
        """Parameters checked before a save; each saved checkpoint gets its sums."""

        def _before_save(self, control, model) -> None:
            if not control.should_save or model is None:
                return
            bad = non_finite_parameters(model, trainable_only=True)
            if not everyone(not bad):
                raise TrainingError(f"parameters became non-finite ({', '.join(bad[:3]) or 'on another process'}); "
                                    "no checkpoint was written: lower the learning rate")

        def on_step_end(self, args, state, control, model=None, **kwargs):
            self._before_save(control, model)

        def on_epoch_end(self, args, state, control, model=None, **kwargs):
            self._before_save(control, model)

        def on_save(self, args, state, control, **kwargs):
            dist = _dist()
            if dist is not None:
                dist.barrier()  # every process has written its part (optimizer shards, RNG states)
            if state.is_world_process_zero:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                if folder.is_dir():
                    write_sums(folder)
            if dist is not None:
                dist.barrier()

    return _Guard()


def _check_loss(_module: nn.Module, _inputs: Any, output: Any) -> None:
    loss = output[0] if isinstance(output, (tuple, list)) else output
    if not isinstance(loss, torch.Tensor):
        return
    if not everyone(bool(torch.isfinite(loss.detach()).all())):
        raise TrainingError("the loss is not finite (on this or another process); training stopped before "
                            "this step's update: lower the learning rate or check the data")


def train_guarded(trainer, checkpoint_dir: str | Path) -> None:
    """``trainer.train()`` with the guards of the module docstring, resuming from
    :func:`resumable_checkpoint` of ``checkpoint_dir`` (the trainer's ``output_dir``)."""
    resume = resumable_checkpoint(checkpoint_dir)
    losses = trainer.loss.values() if isinstance(trainer.loss, dict) else [trainer.loss]
    hooks = [loss.register_forward_hook(_check_loss) for loss in losses if isinstance(loss, nn.Module)]
    guard = _callback()
    trainer.add_callback(guard)
    save = getattr(trainer, "_save_checkpoint", None)  # the trainer's one place that writes checkpoint-N
    own = vars(trainer).get("_save_checkpoint")  # someone's instance-level replacement, put back afterwards
    if callable(save):
        def save_or_say_why(*args, **kwargs):
            try:
                return save(*args, **kwargs)
            except WRITE_ERRORS as exc:  # a full disk: safetensors' SafetensorError, torch's RuntimeError ...
                folder = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
                raise checkpoint_write_error(folder, exc) from exc

        trainer._save_checkpoint = save_or_say_why
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        for h in hooks:
            h.remove()
        trainer.remove_callback(guard)
        if callable(save):
            if own is None:
                del trainer._save_checkpoint  # the class's method again
            else:
                trainer._save_checkpoint = own
