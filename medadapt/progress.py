"""One progress system for every long step of medadapt: rich bars on stderr, one switch for all of them.

Every long loop in the library (encoding into the cache, indexing, mining, labelling, HyReC state caches,
exports) asks this module for a bar with :func:`progress`; the training loop's bar
(:class:`medadapt.training.progress.StepProgress`) draws into the same display. All bars of a process share
one ``rich.progress.Progress`` on stderr, so bars stack instead of overwriting each other, warnings and log
lines print above them, and stdout stays clean for data (``medadapt search`` writes TREC runs there).

Why hand-written (small): tqdm draws its own bars (its rich front end, ``tqdm.rich``, is marked experimental
and warns on use), and ``rich.progress.track`` only wraps iterables. medadapt needs one tqdm-shaped object
(``update`` / ``close`` / iteration / context manager) that draws through a shared rich display, and a
process-wide level set by the CLI's ``--quiet`` / ``--verbose``:

* ``"quiet"``: no bars at all;
* ``"normal"`` (default): medadapt's bars, third-party bars and logs silenced where medadapt shows its own
  (:func:`medadapt.cli._common.quiet_libraries`);
* ``"verbose"``: medadapt's bars plus the libraries' own logs and bars (transformers, sentence-transformers,
  datasets), for debugging.

Example::

    from medadapt.progress import progress

    for text in progress(texts, desc="tokenising", unit="doc"):
        ...
    with progress(total=n, desc="indexing", unit="doc") as bar:
        bar.update(batch)
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
    """A rich ``Console`` that prints text as it is: no markup (``[/bold]``, ``[red]``, ``[link=x]`` in a query,
    a title or a path stays literal and never raises ``MarkupError``) and no emoji codes (``:pill:`` stays).
    Every console medadapt prints through is one of these (the CLI's, the progress display's); styled bits
    are ``rich.text.Text`` objects, never markup in strings."""
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
    """A tqdm-shaped progress bar drawn in the shared rich display (see the module docstring).

    Args:
        iterable: iterate over it while advancing the bar by one per item.
        total: number of steps (``len(iterable)`` when it has one; ``None``: a counter without an end).
        desc: what is being done, e.g. ``"encoding (document)"``.
        unit: what a step is, e.g. ``"doc"``.
        disable: draw nothing (``show_progress=False``); the level ``"quiet"`` disables every bar.
    """

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
        """Jump to ``completed`` steps (and a new ``total`` / ``desc``), e.g. a training loop that reports
        its global step, or resumes in the middle."""
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
    """Call a sentence-transformers encode function (``model.encode_query`` ...) with a medadapt bar instead of
    its own ``Batches`` bar: without ``show_progress`` one call, exactly as before; with it, the texts go in
    chunks of ``16 * batch_size`` (the bar advances per chunk) and the outputs are concatenated (numpy arrays
    or torch tensors, as ``fn`` returns them)."""
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
