"""Atomic, resumable training checkpoints: each ``step-XXXXXXXX`` folder (tensors, optimiser state read
back with ``weights_only=True``, ``state.json`` and a ``SHA256SUMS`` listing every file) is written under a
temporary name and renamed into place. Hand-written because Accelerate's ``save_state`` writes in place and
expects one optimiser per run. See docs/training.md."""

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
from safetensors import SafetensorError  # its writer's own error type (not an OSError)
from safetensors.torch import load_file

from medadapt.checksums import verify_sums, write_sums
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_save_tensors

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
    """``cannot write checkpoint PATH: REASON``: an ``OSError``'s reason, the message
    safetensors wraps in ``IoError(...)``, else the error's first line."""
    if isinstance(exc, OSError) and exc.strerror:
        reason = exc.strerror
    else:
        text = str(exc).strip()
        found = re.search(r'message: "([^"]+)"', text) or re.search(r"cannot write [^:]+: (.+)", text)
        reason = found.group(1) if found else (text.splitlines() or [type(exc).__name__])[0]
    return CheckpointWriteError(f"cannot write checkpoint {path}: {reason}")


@dataclass
class CheckpointConfig:
    """Where (``directory``) and how often (``every_steps``; ``None``: at the end of each stage) the
    loop checkpoints, how many to ``keep``, and whether to ``resume`` from the newest."""

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
    """Write one checkpoint atomically and prune old ones; a refused write is one
    :class:`CheckpointWriteError` and leaves the earlier checkpoints untouched."""
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
    """``(head_state, optimizer_state, state)`` of a checkpoint folder; :class:`CheckpointCorruptError`
    when a file is missing, unlisted, unreadable or differs from ``SHA256SUMS``."""
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
