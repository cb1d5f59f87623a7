"""What an evaluation task is, the registry of task kinds, and :func:`evaluate`, the one entry point.

As in MTEB (``TaskMetadata`` + ``AbsTask*`` kinds): a :class:`TaskMetadata` describes a task, a *kind* is one
:class:`EvalTask` subclass in one file of this package (found on first lookup) that reads its data and scores
a model. Suites, a recipe's evaluation, the mteb export and ``medadapt eval`` all score through :func:`evaluate`.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from medadapt.data import builtin_names, check_split, resolve_data_dir
from medadapt.errors import DataError, MedAdaptError

__all__ = ["EvalSettings", "EvalTask", "TaskMetadata", "TaskResult", "evaluate", "register_task_kind",
           "task_kind", "task_kinds", "task_prompts"]

_KINDS: dict[str, type[EvalTask]] = {}
_discovered = False


def register_task_kind(cls: type[EvalTask]) -> type[EvalTask]:
    """Class decorator: make ``cls`` the task kind ``cls.kind`` (a later registration of the name replaces it)."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} names no kind")
    _KINDS[cls.kind] = cls
    return cls


def _discover() -> None:
    """Import every module of this package once, so each builtin kind has registered itself."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if info.name != "base" and not info.name.startswith("_"):
            importlib.import_module(f"{__package__}.{info.name}")


def task_kinds() -> list[str]:
    """The registered kind names."""
    _discover()
    return list(_KINDS)


def task_kind(name: str) -> type[EvalTask]:
    """The :class:`EvalTask` subclass of kind ``name``; an unknown name is a ``ValueError`` listing the kinds."""
    _discover()
    if name not in _KINDS:
        raise ValueError(f"task kind must be one of {', '.join(_KINDS)}, got {name!r}")
    return _KINDS[name]


@dataclass(frozen=True)
class TaskMetadata:
    """One task: its name (the folder under a suite's data folder), kind, metrics (default: the kind's) and
    main metric (default: the first), the paper's query instruction and document prompt, languages (ISO 639-1;
    several query languages read ``queries-<lang>.jsonl``), a grouping ``family``, ``optional`` (read only when
    its folder exists) and ``layout`` (a kind's file layout, e.g. rerank's ``"mteb"`` rows)."""

    name: str
    kind: str
    metrics: tuple[str, ...] = ()
    main_metric: str = ""
    query_instruction: str | None = None
    document_prompt: str | None = None
    query_languages: tuple[str, ...] = ("en",)
    corpus_language: str = "en"
    family: str = ""
    optional: bool = False
    layout: str = ""

    def __post_init__(self):
        metrics = tuple(self.metrics) or task_kind(self.kind).default_metrics
        object.__setattr__(self, "metrics", metrics)
        object.__setattr__(self, "main_metric", self.main_metric or metrics[0])
        if self.main_metric not in self.metrics:
            raise ValueError(f"{self.name}: main metric {self.main_metric!r} is not in {self.metrics}")


@dataclass(frozen=True)
class EvalSettings:
    """How :func:`evaluate` scores: what a kind's :meth:`EvalTask.score` reads."""

    metrics: tuple[str, ...]
    mode: str | None = None
    route: str | None = None
    similarity: str = "cosine"
    cache: Any = None
    batch_size: int = 64
    show_progress: bool = False
    #: ``False``: the cache is thrown away after this run (``--no-cache``), so a model may compute instead
    reuse_cache: bool = True
    #: a list: retrieval scorers also append each split's run (``{query id: {doc id: score}}``) to it, the
    #: per-query input of a paired comparison (:func:`medadapt.eval.compare.cli_compare`)
    runs: list | None = None
    #: retrieval: re-rank the first stage's run with ``rerank.build(model, cache=..., show_progress=...)``
    #: (e.g. :class:`~medadapt.retrieval.late.MaxSimConfig`); metrics are those of the re-ranked run
    rerank: Any = None


@dataclass
class TaskResult:
    """What :func:`evaluate` returns: metrics per query language (one entry for a one-language task)."""

    task: str
    kind: str
    split: str
    scores: dict[str, dict[str, float]]
    query_prompt: str | None = None
    document_prompt: str | None = None

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics of the first (usually the only) query language."""
        return next(iter(self.scores.values()))


class EvalTask:
    """A task kind: reads its data (:meth:`load` from a suite folder, :meth:`load_data` from ``--data``) and
    scores a model (:meth:`score`). Loading returns a copy holding the data, so a suite's tasks serve every run."""

    kind: ClassVar[str] = ""
    default_metrics: ClassVar[tuple[str, ...]] = ()
    #: the metrics a kind always reports (``--metrics`` refused), e.g. ``"pearson and spearman"``
    fixed_metrics: ClassVar[str | None] = None
    #: retrieval sides the kind scores (``mode=``); empty: the model's embeddings only
    modes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, metadata: TaskMetadata):
        if metadata.kind != self.kind:
            raise ValueError(f"{type(self).__name__} is kind {self.kind!r}, the metadata says {metadata.kind!r}")
        self.metadata = metadata
        self.data: Any = None
        self.paths: list[Path] = []
        self.split: str | None = None

    @classmethod
    def create(cls, name: str, **metadata) -> EvalTask:
        """A task of this kind named ``name`` (other :class:`TaskMetadata` fields as keywords)."""
        return cls(TaskMetadata(name, cls.kind, **metadata))

    def __getattr__(self, name: str):  # name, metrics, family ...: the metadata's
        if name == "metadata" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.metadata, name)

    def __repr__(self) -> str:
        state = f", {self.split!r} loaded" if self.data is not None else ""
        return f"{type(self).__name__}({self.metadata.name!r}{state})"

    # ------------------------------------------------------------------------------------------- loading
    def read(self, path: Path) -> Any:
        """The items of one task file (file kinds); a malformed file is a :class:`DataError` naming it."""
        raise NotImplementedError(f"task kind {self.kind} reads no single file")

    def with_data(self, data: Any, paths: Sequence[Path], split: str) -> EvalTask:
        """A copy of this task holding ``data`` read from ``paths`` for ``split``."""
        loaded = copy.copy(self)
        loaded.data, loaded.paths, loaded.split = data, list(paths), split
        return loaded

    def load(self, folder: str | Path, split: str = "test") -> EvalTask:
        """Read the task from a suite's data folder: ``<folder>/<name>/<split>.jsonl`` for file kinds."""
        folder, name = Path(folder), self.metadata.name
        path = folder / name / f"{split}.jsonl"
        if not path.is_file():
            if (folder / name).is_dir():
                have = sorted(p.name for p in (folder / name).glob("*.jsonl"))
                raise DataError(f"{name}: no file for split {split!r}: {path} not found "
                                f"(found: {', '.join(have) or 'no .jsonl files'})")
            raise DataError(f"task {name} is missing from {folder}: expected {path}")
        return self.with_data(self.read(path), [path], split)

    def load_data(self, data: str | Path, split: str = "test") -> EvalTask:
        """Read the task from ``--data``: the file itself, ``<dir>/<kind>/<split>.jsonl`` or ``<dir>/<kind>.jsonl``."""
        check_split(split)
        path = resolve_data_dir(data)
        if not path.exists():
            raise DataError(f"data not found: {data} is neither a file, a folder nor a builtin dataset "
                            f"({', '.join(builtin_names())})")
        if not path.is_file():
            found = [p for p in (path / self.kind / f"{split}.jsonl", path / f"{self.kind}.jsonl") if p.is_file()]
            if not found:
                raise DataError(f"no {self.kind} file in {path} (looked for {self.kind}/{split}.jsonl and "
                                f"{self.kind}.jsonl)")
            path = found[0]
        return self.with_data(self.read(path), [path], split)

    # ------------------------------------------------------------------------------------------- scoring
    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        """``{query language: {metric: value}}`` of ``model`` on the loaded data."""
        raise NotImplementedError


@contextmanager
def task_prompts(model, query_prompt: str | None, document_prompt: str | None) -> Iterator[None]:
    """Set the ``query`` (and ``document``) prompt of ``model`` for one task, the model's own prompts back after."""
    if not query_prompt and not document_prompt:
        yield
        return
    old_prompts = dict(getattr(model, "prompts", None) or {})
    old_default = getattr(model, "default_prompt_name", None)
    new = dict(old_prompts)
    if query_prompt:
        new["query"] = query_prompt
    if document_prompt:
        for name in ("passage", "corpus"):  # encode_document would prefer "document" anyway; no ambiguity
            new.pop(name, None)
        new["document"] = document_prompt
    model.prompts = new
    try:
        yield
    finally:
        model.prompts = old_prompts
        model.default_prompt_name = old_default


def evaluate(model, task: EvalTask, *, metrics: Sequence[str] | None = None, mode: str | None = None,
             query_prompt: str | None = None, document_prompt: str | None = None, route: str | None = None,
             similarity: str = "cosine", cache=None, batch_size: int = 64, show_progress: bool = False,
             reuse_cache: bool = True, runs: list | None = None, rerank=None) -> TaskResult:
    """Score ``model`` on a loaded ``task``: the one evaluation entry point.

    ``model``: a SentenceTransformer (queries through ``encode_query``, documents through ``encode_document``),
    an index (:class:`~medadapt.retrieval.Retriever`) or an encoder with a learned-sparse side. ``mode``
    (retrieval): ``dense``, ``lexical`` or ``hybrid`` (default: an index's kind, a learned-sparse model's hybrid,
    else dense). The prompts are set on the model while the task runs; ``route`` and ``similarity`` are STS's.
    ``runs``: a list that retrieval appends each scored run to. ``rerank`` (retrieval): a re-ranking stage
    applied to the first stage's run (:class:`~medadapt.retrieval.late.MaxSimConfig`; its token model is
    ``model``, an index's own model for an index).
    """
    if task.data is None:
        raise MedAdaptError(f"task {task.metadata.name} holds no data: load it first (task.load(folder, split) "
                            "or task.load_data(path, split))")
    if mode is not None and mode not in task.modes:
        raise MedAdaptError(f"mode {mode} applies to retrieval tasks, not to {task.kind}")
    if metrics and task.fixed_metrics:
        raise MedAdaptError(f"metrics do not apply to {task.kind} (it reports {task.fixed_metrics})")
    if rerank is not None and not task.modes:
        raise MedAdaptError(f"re-ranking applies to retrieval tasks, not to {task.kind}")
    settings = EvalSettings(tuple(metrics or task.metadata.metrics), mode, route, similarity, cache, batch_size,
                            show_progress, reuse_cache, runs, rerank)
    with task_prompts(model, query_prompt, document_prompt):
        scores = task.score(model, settings)
    return TaskResult(task.metadata.name, task.kind, task.split or "", scores, query_prompt, document_prompt)
