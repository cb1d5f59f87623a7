"""Benchmark suites as their papers run them, one module each (``cmedteb``, ``cure``, ...): each declares a
:class:`~medadapt.eval.suites.base.SuiteSpec` (task objects with the paper's instructions and languages, the
paper's averages); layouts of the real data: docs/evaluation.md ("Suites").

    from medadapt.eval.suites import evaluate_suite
    result = evaluate_suite("cure", model, "data/cure")     # SuiteResult: rows, averages, warnings
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from medadapt.errors import MedAdaptError
from medadapt.eval.suites.base import (
    INSTRUCTION_MODES,
    AverageSpec,
    LoadedTask,
    SuiteResult,
    SuiteSpec,
    TaskRow,
    TaskSpec,
    check_languages,
    compute_averages,
    declared_languages,
    instruction_aware,
    load_suite,
    resolve_instructions,
    run_suite,
    task_rows,
)
from medadapt.eval.suites.report import plot_suite, suite_table, write_suite_json

__all__ = [
    "AverageSpec", "INSTRUCTION_MODES", "LoadedTask", "SUITES", "SuiteResult", "SuiteSpec", "TaskRow", "TaskSpec",
    "check_languages", "compute_averages", "declared_languages", "evaluate_suite", "get_suite", "instruction_aware",
    "load_suite", "plot_suite", "register_suite", "resolve_instructions", "run_suite", "suite_names", "suite_table",
    "task_rows", "write_suite_json",
]

#: name -> spec; filled by :func:`register_suite` (the builtin suites register on first use)
SUITES: dict[str, SuiteSpec] = {}
_BUILTIN = ("cmedteb", "cure", "bmretriever", "medmoe", "cmteb")


def register_suite(spec: SuiteSpec, *, replace: bool = False) -> SuiteSpec:
    """Make a suite available by name (to :func:`get_suite`, ``medadapt eval --suite``)."""
    if spec.name in SUITES and not replace:
        raise MedAdaptError(f"a suite named {spec.name!r} is already registered")
    SUITES[spec.name] = spec
    return spec


def _load_builtin() -> None:
    import importlib

    for name in _BUILTIN:
        if name not in SUITES:
            register_suite(importlib.import_module(f"medadapt.eval.suites.{name}").SUITE)


def suite_names() -> list[str]:
    _load_builtin()
    return list(SUITES)


def get_suite(name: str) -> SuiteSpec:
    """The registered suite ``name``; an unknown name is a :class:`MedAdaptError` listing the valid ones."""
    _load_builtin()
    if name not in SUITES:
        raise MedAdaptError(f"unknown suite {name!r}; choose from {', '.join(SUITES)}")
    return SUITES[name]


def evaluate_suite(name: str | SuiteSpec, model, data_dir: str | Path, split: str = "test", *,
                   tasks: Sequence[str] | None = None, cache=None, batch_size: int = 64,
                   show_progress: bool = False, instructions: bool | str = "auto",
                   model_name: str = "") -> SuiteResult:
    """Load every task of suite ``name`` (a registered name or a :class:`SuiteSpec`) from ``data_dir`` (all
    files checked first), evaluate ``model`` on each (``tasks``: only these; averages missing one are ``None``)
    and compute the paper's averages. ``instructions``: see :func:`run_suite`."""
    spec = name if isinstance(name, SuiteSpec) else get_suite(name)
    loaded = load_suite(spec, data_dir, split, tasks)
    return run_suite(spec, model, loaded, split, cache=cache, batch_size=batch_size, show_progress=show_progress,
                     instructions=instructions, model_name=model_name)
