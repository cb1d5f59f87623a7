"""What a suite is: task objects (:mod:`medadapt.eval.tasks`) with the paper's instructions and languages, and
the paper's averages. Every task's files are read before a model is loaded; each task is scored through
:func:`medadapt.eval.tasks.evaluate`, the instructions set as the model's prompts for that task only (by default
only on a model declared instruction-aware, MTEB's convention). A query language the model was not declared for
(``model_card_data.language``) is a warning.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medadapt.data.beir import check_split
from medadapt.errors import DataError, MedAdaptError, warn
from medadapt.eval.tasks import EvalTask, TaskMetadata, evaluate, task_kind, task_prompts

__all__ = [
    "INSTRUCTION_MODES",
    "AverageSpec",
    "LoadedTask",
    "SuiteResult",
    "SuiteSpec",
    "TaskRow",
    "TaskSpec",
    "check_languages",
    "compute_averages",
    "declared_languages",
    "instruction_aware",
    "load_suite",
    "load_task",
    "normalize_language",
    "resolve_instructions",
    "run_suite",
    "task_prompts",
    "task_rows",
]

#: one task of a suite (its name, kind, metrics, instruction, languages): :class:`medadapt.eval.tasks.TaskMetadata`
TaskSpec = TaskMetadata
#: a task whose files were read and checked: a loaded :class:`medadapt.eval.tasks.EvalTask`
LoadedTask = EvalTask


@dataclass(frozen=True)
class AverageSpec:
    """An average the paper reports: the unweighted mean of ``(task, query language or None, metric)`` cells."""

    name: str
    cells: tuple[tuple[str, str | None, str], ...]
    description: str = ""


@dataclass(frozen=True)
class SuiteSpec:
    """A benchmark suite: its tasks, the averages its paper reports, and how instructions become prompts."""

    name: str
    title: str
    tasks: tuple[EvalTask, ...]  # given as TaskMetadata or task objects; kept as task objects
    averages: tuple[AverageSpec, ...] = ()
    #: how an instruction becomes the query prompt (``{instruction}`` is replaced)
    query_template: str = "Instruct: {instruction}\nQuery: "
    #: STS (symmetric): whether both sentences get the query instruction (MTEB and the papers do)
    sts_instruction_both_sides: bool = True
    reference: str = ""

    def __post_init__(self):
        tasks = tuple(t if isinstance(t, EvalTask) else task_kind(t.kind)(t) for t in self.tasks)
        object.__setattr__(self, "tasks", tasks)

    def task(self, name: str) -> EvalTask:
        for t in self.tasks:
            if t.name == name:
                return t
        raise MedAdaptError(f"suite {self.name} has no task {name!r}; its tasks: "
                            f"{', '.join(t.name for t in self.tasks)}")

    def query_prompt(self, task: EvalTask | TaskMetadata) -> str | None:
        if not task.query_instruction:
            return None
        return self.query_template.replace("{instruction}", task.query_instruction)


# ----------------------------------------------------------------------------------------------- loading


def load_task(folder: Path, task: EvalTask, split: str) -> EvalTask:
    """Read and check one task's files (a :class:`~medadapt.errors.DataError` naming the file otherwise)."""
    return task.load(folder, split)


def load_suite(spec: SuiteSpec, data_dir: str | Path, split: str = "test",
               tasks: Sequence[str] | None = None) -> list[LoadedTask]:
    """Read every task of ``spec`` (or the named ``tasks``; an ``optional`` one only when its folder exists)
    from ``data_dir``; a missing folder, task or split, or a malformed file, is a :class:`DataError`."""
    check_split(split)
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataError(f"suite data folder not found: {folder}")
    if tasks:
        chosen = [spec.task(t) for t in dict.fromkeys(tasks)]
    else:
        chosen = [t for t in spec.tasks if not t.optional or (folder / t.name).exists()]
    return [load_task(folder, t, split) for t in chosen]


# ----------------------------------------------------------------------------------------------- languages

#: ISO 639-2/3 codes and English names of the languages the suites use, mapped to ISO 639-1
_LANG_ALIASES = {"eng": "en", "english": "en", "fra": "fr", "fre": "fr", "french": "fr", "spa": "es",
                 "spanish": "es", "zho": "zh", "chi": "zh", "cmn": "zh", "chinese": "zh", "deu": "de",
                 "ger": "de", "german": "de", "multilingual": "*"}


def normalize_language(code: str) -> str:
    """``"en-US"`` / ``"eng"`` / ``"English"`` -> ``"en"``; ``"zh-Hans"`` -> ``"zh"``; ``multilingual`` -> ``*``."""
    base = str(code).strip().lower().replace("_", "-").split("-")[0]
    return _LANG_ALIASES.get(base, base)


def declared_languages(model) -> set[str] | None:
    """The languages a model is declared for (``model.model_card_data.language``, kept in its model card),
    normalised to ISO 639-1 (``multilingual``: ``*``); ``None`` when it declares none."""
    card = getattr(model, "model_card_data", None)
    value = getattr(card, "language", None)
    if not value:
        return None
    values = [value] if isinstance(value, str) else list(value)
    langs = {normalize_language(v) for v in values if str(v).strip()}
    return langs or None


def check_languages(model, query_languages: Sequence[str], where: str) -> list[str]:
    """Warn about query languages the model was not declared for; returns the warnings (kept in the JSON)."""
    declared = declared_languages(model)
    wanted = list(dict.fromkeys(normalize_language(lang) for lang in query_languages))
    messages = []
    if declared is None:
        messages.append(f"{where}: the model declares no language (model_card_data.language is empty), so "
                        f"nothing says it reads queries in {', '.join(wanted)}; set "
                        "model.model_card_data.language to silence this")
    elif "*" not in declared:
        for lang in wanted:
            if lang not in declared:
                messages.append(f"{where}: queries in {lang!r}, but the model is declared for "
                                f"{', '.join(sorted(declared))} only (model_card_data.language); its scores "
                                "on these queries may be meaningless")
    for m in messages:
        warn(m)
    return messages


# ----------------------------------------------------------------------------------------------- prompts

#: ``instructions=`` of a suite run: ``auto`` (only for a model declared instruction-aware), ``on``, ``off``
INSTRUCTION_MODES = ("auto", "on", "off")
#: a query prompt that carries a task instruction: ``Instruct: ...`` (gte-Qwen2, Qwen3-Embedding, e5-mistral,
#: NV-Embed) or ``{instruction}\nQuery: `` (BMRetriever)
_INSTRUCTION_PROMPT = re.compile(r"instruct|\n\s*query\s*:\s*$", re.IGNORECASE)


def instruction_aware(model) -> tuple[bool, str]:
    """Whether ``model`` is declared instruction-aware, and why: as mteb gives task instructions only to models
    registered with ``use_instructions``, a saved model declares itself by its ``query`` prompt: an instruction
    prompt (``Instruct: ...``, or one ending in ``\\nQuery: ``) does; none, or a fixed prefix (E5's
    ``query: ``, kept), does not."""
    prompt = (getattr(model, "prompts", None) or {}).get("query") or ""
    if not prompt.strip():
        return False, "the model has no query prompt, so it is not declared instruction-aware"
    if _INSTRUCTION_PROMPT.search(prompt):
        return True, f"the model's query prompt {prompt!r} is an instruction prompt"
    return False, f"the model's query prompt {prompt!r} is a fixed prefix, not an instruction prompt (kept)"


def resolve_instructions(model, instructions: bool | str = "auto") -> tuple[bool, str, str]:
    """``(apply, mode, reason)`` for ``instructions`` ``"auto"`` / ``"on"`` / ``"off"`` (or ``True`` / ``False``)."""
    if isinstance(instructions, bool):
        mode = "on" if instructions else "off"
    else:
        mode = str(instructions).strip().lower()
    if mode not in INSTRUCTION_MODES:
        raise MedAdaptError(f"instructions must be one of {', '.join(INSTRUCTION_MODES)}, "
                            f"got {instructions!r}")
    if mode == "on":
        return True, mode, "instructions on: the papers' instructions replace the model's query prompt"
    if mode == "off":
        return False, mode, "instructions off: the model's own prompts"
    aware, reason = instruction_aware(model)
    return aware, mode, reason


# ----------------------------------------------------------------------------------------------- results


@dataclass
class TaskRow:
    """The result of one task for one query language."""

    task: str
    family: str
    query_language: str
    corpus_language: str
    main_metric: str
    metrics: dict[str, float]
    query_prompt: str | None = None
    document_prompt: str | None = None

    @property
    def main_score(self) -> float:
        return self.metrics[self.main_metric]

    @property
    def label(self) -> str:
        if self.query_language != self.corpus_language:
            return f"{self.task} ({self.query_language}->{self.corpus_language})"
        return self.task


@dataclass
class SuiteResult:
    """Per-task rows and the paper's averages (``None`` where a task the average needs was not run)."""

    suite: str
    title: str
    split: str
    rows: list[TaskRow]
    averages: dict[str, float | None] = field(default_factory=dict)
    average_definitions: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    model: str = ""
    #: how the papers' instructions were decided: ``{"mode": "auto", "applied": False, "reason": "..."}``
    instructions: dict[str, Any] = field(default_factory=dict)

    def row(self, task: str, language: str | None = None) -> TaskRow:
        for r in self.rows:
            if r.task == task and (language is None or r.query_language == language):
                return r
        raise KeyError(f"no result for task {task!r}" + (f" in {language!r}" if language else ""))

    def to_dict(self) -> dict:
        """The JSON form (``--output``)."""
        return {
            "suite": self.suite,
            "title": self.title,
            "split": self.split,
            "model": self.model,
            "instructions": dict(self.instructions),
            "tasks": [{
                "task": r.task, "family": r.family, "query_language": r.query_language,
                "corpus_language": r.corpus_language, "main_metric": r.main_metric,
                "main_score": round(float(r.main_score), 6),
                "metrics": {k: round(float(v), 6) for k, v in r.metrics.items()},
                "query_prompt": r.query_prompt, "document_prompt": r.document_prompt,
            } for r in self.rows],
            "averages": {k: (None if v is None else round(float(v), 6)) for k, v in self.averages.items()},
            "average_definitions": dict(self.average_definitions),
            "warnings": list(self.warnings),
        }


def compute_averages(spec: SuiteSpec, rows: Sequence[TaskRow]) -> dict[str, float | None]:
    """Each :class:`AverageSpec` of ``spec`` as the mean of its cells (``None`` when a cell has no result)."""
    out: dict[str, float | None] = {}
    for avg in spec.averages:
        values = []
        for task, lang, metric in avg.cells:
            match = [r for r in rows if r.task == task and (lang is None or r.query_language == lang)]
            if not match or metric not in match[0].metrics:
                values = None
                break
            values.append(match[0].metrics[metric])
        out[avg.name] = None if not values else math.fsum(values) / len(values)
    return out


# ----------------------------------------------------------------------------------------------- running


def task_rows(model, spec: SuiteSpec, task: EvalTask, *, cache=None, batch_size: int = 64,
              show_progress: bool = False, instructions: bool = True) -> list[TaskRow]:
    """Score one loaded task through :func:`~medadapt.eval.tasks.evaluate`; one :class:`TaskRow` per query
    language."""
    q_prompt = spec.query_prompt(task) if instructions else None
    d_prompt = task.document_prompt if instructions and task.kind != "sts" else None
    # STS is symmetric: both sentences get the query instruction through the query route
    route = "query" if task.kind == "sts" and spec.sts_instruction_both_sides and q_prompt else None
    result = evaluate(model, task, query_prompt=q_prompt, document_prompt=d_prompt, route=route, cache=cache,
                      batch_size=batch_size, show_progress=show_progress)
    return [TaskRow(task.name, task.family, lang, task.corpus_language, task.main_metric,
                    {m: float(metrics[m]) for m in task.metrics}, q_prompt, d_prompt)
            for lang, metrics in result.scores.items()]


def run_suite(spec: SuiteSpec, model, loaded: Sequence[LoadedTask], split: str = "test", *, cache=None,
              batch_size: int = 64, show_progress: bool = False, instructions: bool | str = "auto",
              model_name: str = "") -> SuiteResult:
    """Evaluate ``model`` on loaded tasks (:func:`load_suite`) and compute the paper's averages.
    ``instructions``: ``"auto"`` (the papers' instructions for a model declared instruction-aware only),
    ``"on"`` or ``"off"``; the decision is kept in the result."""
    apply, mode, reason = resolve_instructions(model, instructions)
    if not any(t.query_instruction or t.document_prompt for t in loaded):
        reason += f" (suite {spec.name} gives no instructions for these tasks)"
    warnings: list[str] = []
    langs = list(dict.fromkeys(lang for t in loaded for lang in t.query_languages))
    warnings += check_languages(model, langs, f"suite {spec.name}")
    rows: list[TaskRow] = []
    for t in loaded:
        rows += task_rows(model, spec, t, cache=cache, batch_size=batch_size, show_progress=show_progress,
                          instructions=apply)
    return SuiteResult(spec.name, spec.title, split, rows, compute_averages(spec, rows),
                       {a.name: a.description for a in spec.averages}, warnings, model_name,
                       {"mode": mode, "applied": apply, "reason": reason})
