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
newest checkpoint whose sums verify, skipping damaged ones with a ``warning:`` line, and says so plainly
when none does. :func:`check_finite_parameters` is the check ``medadapt train`` runs before it writes any
model folder. Hand-written because neither the trainer nor Accelerate offers these checks; they plug in
through the trainer's own callback and a forward hook on the loss, so the training itself is the
trainer's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medadapt.checksums import ChecksumError, verify_sums, write_sums
from medadapt.errors import warn
from medadapt.training.loop import TrainingError

__all__ = ["check_finite_parameters", "resumable_checkpoint", "train_guarded"]

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def _everyone(ok: bool, device: torch.device | str = "cpu") -> bool:
    """``ok`` on every process (one all-reduce of a flag when several run; the tensor lives on ``device``,
    which must suit the process group's backend: the loss's device does)."""
    dist = _dist()
    if dist is None:
        return ok
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
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
    (``where`` says what would have been written)."""
    bad = non_finite_parameters(module)
    if bad:
        raise TrainingError(f"parameters are not finite ({', '.join(bad[:3])}); {where} was not written: "
                            "lower the learning rate or check the data")


def _checkpoints(directory: Path) -> list[Path]:
    """``checkpoint-N`` folders of ``directory``, newest (highest ``N``) first."""
    found = [(int(m.group(1)), p) for p in directory.glob("checkpoint-*")
             if p.is_dir() and (m := _CHECKPOINT.match(p.name))]
    return [p for _, p in sorted(found, reverse=True)]


def resumable_checkpoint(directory: str | Path) -> str | None:
    """The newest trainer checkpoint in ``directory`` whose ``SHA256SUMS`` lists every file and matches
    (``None`` when there is no checkpoint). Damaged or unlisted ones are skipped with a warning.

    Raises:
        TrainingError: there are checkpoints but none reads back intact.
    """
    directory = Path(directory)
    found = _checkpoints(directory) if directory.is_dir() else []
    problems = []
    for path in found:
        try:
            verify_sums(path, complete=True)
            return str(path)
        except ChecksumError as exc:
            problems.append(str(exc))
            warn(f"checkpoint {path.name}: {exc}; resuming from the one before it")
    if found:
        raise TrainingError(f"no checkpoint in {directory} reads back intact ({'; '.join(problems[:2])}); pass "
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
            device = next((p.device for p in model.parameters()), torch.device("cpu"))
            if not _everyone(not bad, device):
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
    if not _everyone(bool(torch.isfinite(loss.detach()).all()), loss.device):
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
    try:
        trainer.train(resume_from_checkpoint=resume)
    finally:
        for h in hooks:
            h.remove()
        trainer.remove_callback(guard)
