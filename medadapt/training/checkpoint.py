"""Atomic, resumable training checkpoints.

Each ``step-XXXXXXXX`` folder (weights, optimizer / scheduler state read back with ``weights_only=True``,
``state.json``, and a ``SHA256SUMS`` that must list every file) is written under a temporary name and renamed
into place. Unreadable checkpoints raise :class:`CheckpointCorruptError` so the loop can fall back
(:func:`readable_checkpoints`); write failures are one :class:`CheckpointWriteError` and keep earlier ones.
Hand-written because Accelerate's ``save_state`` writes in place and expects one optimizer per run. See
docs/training.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from medadapt.checksums import verify_sums, write_sums
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_save_tensors

try:  # safetensors' writer raises its own type for a failed write (not an OSError)
    from safetensors import SafetensorError
except ImportError:  # pragma: no cover - safetensors comes with transformers
    class SafetensorError(Exception):  # type: ignore[no-redef]
        pass

PREFIX = "step-"
#: The files of a checkpoint folder, all listed in its ``SHA256SUMS``.
FILES = ("head.safetensors", "optimizer.pt", "state.json")


class CheckpointCorruptError(Exception):
    """A checkpoint folder whose files are missing, unreadable or differ from their recorded checksums."""


class CheckpointWriteError(MedAdaptError):
    """A checkpoint could not be written (a full disk, a quota, a read-only file system)."""


#: What writing a checkpoint raises when the file system refuses: ``OSError`` (Python's writes),
#: ``RuntimeError`` (``torch.save``: "PytorchStreamWriter failed writing file"), ``SafetensorError``
#: (safetensors' ``save_file`` behind ``save_pretrained``) and medadapt's own ``cannot write`` errors.
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError, MedAdaptError)


def checkpoint_write_error(path: str | Path, exc: BaseException) -> CheckpointWriteError:
    """``cannot write checkpoint PATH: REASON`` for an error raised while writing a checkpoint: the reason
    of an ``OSError`` (``No space left on device``), the message safetensors wraps in
    ``IoError(Os { ..., message: "..." })``, else the first line of the error."""
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        text = str(exc).strip()
        found = re.search(r'message: "([^"]+)"', text) or re.search(r"cannot write [^:]+: (.+)", text)
        reason = found.group(1) if found else (text.splitlines() or [type(exc).__name__])[0]
    return CheckpointWriteError(f"cannot write checkpoint {path}: {reason}")


@dataclass
class CheckpointConfig:
    """Where and how often :func:`~medadapt.training.loop.train` checkpoints.

    Attributes:
        directory: folder holding ``step-*`` checkpoints.
        every_steps: save every N optimiser steps (``None``: only at the end of each stage).
        keep: how many recent checkpoints to keep.
        resume: continue from the newest checkpoint in ``directory`` when there is one.
    """

    directory: Path
    every_steps: int | None = None
    keep: int = 2
    resume: bool = True

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError("every_steps must be >= 1 or None")
        if self.keep < 1:
            raise ValueError("keep must be >= 1")


def all_checkpoints(directory: str | Path) -> list[Path]:
    """Complete-looking checkpoint folders of ``directory``, newest first (temporaries ignored)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.glob(f"{PREFIX}*") if p.is_dir() and (p / "state.json").is_file()),
                  reverse=True)


def latest_checkpoint(directory: str | Path) -> Path | None:
    found = all_checkpoints(directory)
    return found[0] if found else None


def save_checkpoint(config: CheckpointConfig, step: int, head_state: dict[str, torch.Tensor],
                    optimizer_state: dict[str, Any], state: dict[str, Any]) -> Path:
    """Write one checkpoint atomically and prune old ones; returns its path.

    Raises:
        CheckpointWriteError: the file system refused a write (nothing of this checkpoint is left; the
            previous ones are untouched).
    """
    final = config.directory / f"{PREFIX}{step:08d}"
    tmp = config.directory / f".tmp-{uuid.uuid4().hex}"
    try:
        config.directory.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise checkpoint_write_error(final, exc) from exc
    try:
        atomic_save_tensors(tmp / "head.safetensors", head_state)
        torch.save(optimizer_state, tmp / "optimizer.pt")
        (tmp / "state.json").write_text(json.dumps(state), encoding="utf-8")
        write_sums(tmp, FILES)  # state.json too: its step and fingerprint decide what a resume does
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except WRITE_ERRORS as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise checkpoint_write_error(final, exc) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    done = sorted(p for p in config.directory.glob(f"{PREFIX}*") if p.is_dir())
    for old in done[: -config.keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """Return ``(head_state, optimizer_state, state)`` of a checkpoint directory.

    Raises:
        CheckpointCorruptError: a file is missing, unlisted or unreadable, or differs from ``SHA256SUMS``
            (which every checkpoint folder must have, so ``state.json`` is checked before it is parsed).
    """
    from safetensors.torch import load_file

    path = Path(path)
    try:
        verify_sums(path, cover=FILES, complete=True)
        state = json.loads((path / "state.json").read_text(encoding="utf-8"))
        if not isinstance(state, dict) or "step" not in state:
            raise ValueError("state.json has no step")
        head_state = load_file(str(path / "head.safetensors"))
        optimizer_state = torch.load(path / "optimizer.pt", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - safetensors, torch and json each raise their own types
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise CheckpointCorruptError(f"{path.name}: {first}") from None
    return head_state, optimizer_state, state
