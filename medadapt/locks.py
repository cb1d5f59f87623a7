"""Process-wide locks for threads of one process: one per path (a folder being saved, a cache namespace) and
one per model object.

Locks between *processes* are elsewhere (``flock`` on a namespace's ``.lock``, :mod:`medadapt.cache`); these
make the same code safe for several threads of one process, which share a process id and would otherwise
only be told apart by luck:

* :func:`path_lock`: writers of one target folder (:func:`medadapt.io.replace_folder`) swap in turn;
  writers of one cache namespace encode in turn.
* :func:`model_lock`: work that tokenises with a model. A Hugging Face fast tokenizer keeps its truncation
  and padding settings as mutable state that every call sets, so two threads tokenising with one model at
  once can corrupt each other's batches (``expected sequence of length 128 at dim 1 (got 27)``) or hash
  the wrong ids into a fingerprint. medadapt's own uses (the embedding cache, adapter saves) take it; a
  caller's own ``model.encode`` in another thread does not.

Both are re-entrant (:class:`threading.RLock`): a thread holding one may take it again.
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
    """The process-wide lock of ``path`` (its absolute, symlink-resolved form: a link and its target share
    one lock)."""
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
