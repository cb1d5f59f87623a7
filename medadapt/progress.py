"""One progress system for every long step of medadapt: rich bars on stderr, one switch for all of them.

Every long loop asks :func:`progress` for a tqdm-shaped :class:`Bar`; all bars of a process (the training
loop's too) share one ``rich.progress.Progress`` on stderr, so they stack, logs print above them and stdout
stays clean for data. The level (CLI ``--quiet`` / ``--verbose``): ``"quiet"`` no bars, ``"normal"``
medadapt's bars with third-party bars and logs silenced, ``"verbose"`` the libraries' own too. Hand-written:
tqdm draws its own bars (``tqdm.rich`` is experimental) and ``rich.progress.track`` only wraps iterables.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any, Literal

__all__ = ["Bar", "level", "plain_console", "progress", "set_level", "shared_progress", "release_progress"]

Level = Literal["quiet", "normal", "verbose"]
_LEVEL: Level = "normal"
_LOCK = threading.RLock()
_SHARED: Any = None  # the rich Progress while at least one bar is open
_USERS = 0


def set_level(value: Level) -> None:
    """Set the process-wide progress level (``"quiet"``, ``"normal"`` or ``"verbose"``)."""
    global _LEVEL
    if value not in ("quiet", "normal", "verbose"):
        raise ValueError(f"progress level must be quiet, normal or verbose, not {value!r}")
    _LEVEL = value


def level() -> Level:
    """The process-wide progress level."""
    return _LEVEL


def plain_console(stderr: bool = False):
    """A rich ``Console`` that prints text literally: no markup (``[red]`` in a query stays, never a
    ``MarkupError``) and no emoji codes. Every console medadapt prints through is one (styles: ``Text``)."""
    from rich.console import Console

    return Console(stderr=stderr, markup=False, emoji=False)


def shared_progress():
    """The process's one ``rich.progress.Progress`` (started on first use); pair with
    :func:`release_progress`. Every task must carry an ``info`` field (may be empty)."""
    global _SHARED, _USERS
    with _LOCK:
        if _SHARED is None:
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                       TimeRemainingColumn)

            # descriptions and infos hold data (file names, set names): shown literally, never read as markup
            _SHARED = Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                               MofNCompleteColumn(), TextColumn("{task.fields[unit]}", markup=False),
                               TextColumn("{task.fields[info]}", markup=False), TimeElapsedColumn(),
                               TimeRemainingColumn(), console=plain_console(stderr=True))
            _SHARED.start()
        _USERS += 1
        return _SHARED


def release_progress() -> None:
    """Drop one user of the shared display; the last one stops it (finished bars stay printed)."""
    global _SHARED, _USERS
    with _LOCK:
        _USERS = max(0, _USERS - 1)
        if _USERS == 0 and _SHARED is not None:
            _SHARED.stop()
            _SHARED = None


class Bar:
    """A tqdm-shaped bar in the shared display: iterate over ``iterable`` or call :meth:`update`.
    ``total``: default ``len(iterable)``, ``None`` a counter; ``disable`` (or level ``"quiet"``): draw nothing."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", disable: bool = False):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.n = iterable, total, 0
        self.disable = disable or _LEVEL == "quiet"
        self._progress = self._task = None
        if not self.disable:
            self._progress = shared_progress()
            self._task = self._progress.add_task(desc, total=total, unit=unit, info="")

    def update(self, n: int = 1) -> None:
        """Advance by ``n`` steps."""
        self.n += n
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def set_info(self, text: str) -> None:
        """Show ``text`` after the counts (e.g. the current loss)."""
        if self._progress is not None:
            self._progress.update(self._task, info=text)

    def set_state(self, completed: int, total: int | None = None, desc: str | None = None) -> None:
        """Jump to ``completed`` steps (and a new ``total`` / ``desc``), e.g. a resumed training loop."""
        self.n = completed
        if total is not None:
            self.total = total
        if self._progress is not None:
            fields: dict[str, Any] = {"completed": completed, "total": self.total}
            if desc is not None:
                fields["description"] = desc
            self._progress.update(self._task, **fields)

    def close(self) -> None:
        """Finish the bar (idempotent)."""
        if self._progress is not None:
            self._progress.update(self._task, total=self.total if self.total is not None else self.n)
            self._progress = None
            release_progress()

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("this bar wraps no iterable; call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             disable: bool = False) -> Bar:
    """A :class:`Bar`: ``for x in progress(items, desc=...)`` or ``with progress(total=n, ...) as bar``."""
    return Bar(iterable, total=total, desc=desc, unit=unit, disable=disable)


def encode_with_progress(fn, texts: list, *, batch_size: int = 64, show_progress: bool = False, desc: str = "",
                         **kwargs):
    """Call a sentence-transformers encode function (``model.encode_query`` ...) with a medadapt bar instead
    of its own: with ``show_progress`` in chunks of ``16 * batch_size``, the outputs (numpy or torch)
    concatenated; without, one plain call."""
    kwargs["show_progress_bar"] = False
    texts = list(texts)
    if not show_progress or len(texts) <= batch_size:
        return fn(texts, batch_size=batch_size, **kwargs)
    step = 16 * batch_size
    parts = []
    with progress(total=len(texts), desc=desc or "encoding", unit="text") as bar:
        for start in range(0, len(texts), step):
            chunk = texts[start : start + step]
            parts.append(fn(chunk, batch_size=batch_size, **kwargs))
            bar.update(len(chunk))
    first = parts[0]
    if hasattr(first, "detach"):  # torch tensors (convert_to_tensor=True)
        import torch

        return torch.cat(parts)
    import numpy as np

    return np.concatenate([np.asarray(p) for p in parts])
