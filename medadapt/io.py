"""Atomic file writes: write to a temporary file in the same directory, fsync, then ``os.replace``.

A killed process therefore leaves either the old file or the new one, never a half-written file.
Hand-written because the standard library has no one-call atomic write.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; rename it onto ``path`` only on success."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, sort_keys=False) + "\n")


def atomic_save_npy(path: str | os.PathLike, array) -> None:
    """Save a numpy array as ``.npy`` atomically (``allow_pickle`` is never used)."""
    import numpy as np

    with atomic_open(path, "wb") as f:
        np.save(f, np.ascontiguousarray(array), allow_pickle=False)


@contextlib.contextmanager
def replace_folder(target: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to write into; on success it replaces ``target`` as a whole (old
    folder renamed away, new one renamed in, old one deleted), so a crash leaves the old or the new
    folder, never a mix. Hand-written: no library swaps directories."""
    target = Path(target)
    tmp = target.parent / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
