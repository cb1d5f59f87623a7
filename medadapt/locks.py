"""Re-entrant locks for the threads of one process: :func:`path_lock` per path, :func:`model_lock` per model
(a tokenizer's settings are mutable state). Locks between processes: ``flock`` in :mod:`medadapt.cache`.
"""

from __future__ import annotations

import os
import threading
import weakref

__all__ = ["model_lock", "path_lock"]

_GUARD = threading.Lock()
_PATHS: dict[str, threading.RLock] = {}  # a handful of targets per process: never pruned
_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # dropped with the model
_UNREFERENCEABLE = threading.RLock()  # for the rare object that takes no weak reference


def path_lock(path: str | os.PathLike) -> threading.RLock:
    """The process-wide lock of ``path`` (a link and its target share one)."""
    key = os.path.realpath(os.fspath(path))
    with _GUARD:
        lock = _PATHS.get(key)
        if lock is None:
            lock = _PATHS[key] = threading.RLock()
        return lock


def model_lock(model) -> threading.RLock:
    """The process-wide lock of the model object ``model`` (by identity; released with the model)."""
    with _GUARD:
        try:
            lock = _MODELS.get(model)
            if lock is None:
                lock = _MODELS[model] = threading.RLock()
        except TypeError:  # not weakly referenceable (or unhashable): one shared lock
            return _UNREFERENCEABLE
        return lock
