"""Systems: each system registers everything it contributes with one :func:`register_system` call.

A system (Med-MoE-Embed, CARE, HyReC, BMRetriever, or one from another distribution) makes the call in
its own package and names that module under the ``medadapt.systems`` entry-point group
(``pyproject.toml``). The lookups of the core read from here: recipe kinds
(:mod:`medadapt.recipes.registry`), the planner (:mod:`medadapt.plan.planner`), head types
(:mod:`medadapt.adapters.types`), branches and their compositions (:mod:`medadapt.adapters.compose`),
report notes (:mod:`medadapt.report.build`) and mining presets (:mod:`medadapt.curation.mining_config`).
Entry points are imported once, when a lookup first needs them; nothing here imports a system.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medadapt.errors import ConfigError
from medadapt.yaml_input import read_yaml

__all__ = ["ENTRY_POINT_GROUP", "System", "broken", "find", "load_paper", "register_system", "registered"]

ENTRY_POINT_GROUP = "medadapt.systems"


@dataclass(frozen=True)
class System:
    """What one system contributes (``ctx`` below is the runner's :class:`~medadapt.recipes.run.RunContext`).

    Attributes:
        kind: the recipe's ``kind:`` value, and the entry point's name.
        schema: the pydantic recipe class (a :class:`~medadapt.recipes.base.RecipeBase` subclass); ``None``
            for a plugin that only contributes components (a head type, a branch).
        train: ``train(recipe, ctx) -> model``: trains and returns the model (anything with
            ``save(folder)``), filling ``ctx.result`` (losses, timings, details).
        evaluate: ``evaluate(recipe, model, ctx) -> {metric: value}`` (``None``: no evaluation).
        summary: one line for help and errors.
        paper: the paper's equations and hyperparameters as ``section.field: value`` overrides, with a
            reason each (``{path: (value, "paper §/eq./table")}``), applied by ``--paper``; ``None``: no
            paper mode.
        base: ``base(recipe, ctx) -> model | None``: the frozen base model the trained one is compared with
            (``None``: the trained model with its heads disabled, else the recipe's ``model.backbone``).
        plan: ``plan(recipe) -> PlanSpec`` for ``medadapt plan`` (:mod:`medadapt.plan`).
        adapter_types: the :class:`~medadapt.adapters.types.AdapterType` heads it offers.
        branches: the :class:`~medadapt.adapters.compose.BranchKind` branches it offers (each with the
            bases it composes on).
        mining_presets: named :class:`~medadapt.curation.MiningConfig` settings from its paper.
        report_notes: ``report_notes(run, analysis) -> [str]``: what ``medadapt report`` says about a run of
            this kind that shows no expert load (``None``: one neutral line).
        sparse_scorers: ``{encoder_tag: fn(encoder, data, split, mode, metrics, settings) -> metrics}``: how
            evaluation scores the learned-sparse encoders it offers (default: an in-memory index); when
            ``settings.runs`` is a list, the scorer appends the run it scored to it (paired comparisons).
    """

    kind: str
    schema: type | None = None
    train: Callable[[Any, Any], Any] | None = None
    evaluate: Callable[[Any, Any, Any], dict[str, float]] | None = None
    summary: str = ""
    paper: dict[str, tuple[Any, str]] | None = None
    base: Callable[[Any, Any], Any] | None = None
    plan: Callable[[Any], Any] | None = None
    adapter_types: tuple[Any, ...] = ()
    branches: tuple[Any, ...] = ()
    mining_presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    report_notes: Callable[[Any, Any], list[str]] | None = None
    sparse_scorers: Mapping[str, Callable[..., dict[str, float]]] = field(default_factory=dict)

    def paper_settings(self) -> dict[str, Any]:
        """The paper settings as ``{"section.field": value}``; a kind without a paper mode is refused."""
        if not self.paper:
            raise ConfigError(f"recipe kind {self.kind!r} has no paper mode")
        return {path: value for path, (value, _why) in self.paper.items()}


def load_paper(path: str | Path) -> dict[str, tuple[Any, str]]:
    """A system's paper overlay, the ``paper.yaml`` beside its recipe code: entries
    ``section.field: {value: ..., why: "paper §"}`` as ``{path: (value, why)}``. A malformed file is one
    :class:`~medadapt.errors.ConfigError` naming the entry."""
    data, _ = read_yaml(path)
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{path}: a paper overlay is a mapping of section.field: {{value: ..., why: '...'}}")
    out: dict[str, tuple[Any, str]] = {}
    for key, entry in data.items():
        if not (isinstance(key, str) and "." in key and isinstance(entry, dict) and set(entry) == {"value", "why"}
                and isinstance(entry["why"], str) and entry["why"].strip()):
            raise ConfigError(f"{path}: {key}: an entry is section.field: {{value: ..., why: 'where the paper "
                              "says so'}")
        out[key] = (entry["value"], entry["why"])
    return out


_SYSTEMS: dict[str, System] = {}
_BROKEN: dict[str, str] = {}  # kind -> why its module could not be imported (a missing optional dependency)
_loaded = False


def register_system(system: System) -> System:
    """Register (or re-register, e.g. on module reload) a system; returns it."""
    if (system.schema is None) != (system.train is None):
        raise ConfigError(f"system {system.kind!r}: a recipe kind needs both schema and train")
    _SYSTEMS[system.kind] = system
    return system


def _load_entry_points() -> None:
    """Import, once, the module of every entry point of the group whose system is not registered yet; an
    ``ImportError`` (optional dependencies missing) marks the system broken."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _SYSTEMS:
            try:
                ep.load()
            except ImportError as exc:
                _BROKEN[ep.name] = str(exc)


def registered() -> list[System]:
    """Every registered system, in registration order (entry points loaded first)."""
    _load_entry_points()
    return list(_SYSTEMS.values())


def find(kind: str) -> System | None:
    """The system ``kind`` (``None``: none registered under that name)."""
    if kind not in _SYSTEMS:
        _load_entry_points()
    return _SYSTEMS.get(kind)


def broken(kind: str) -> str | None:
    """Why the system ``kind``'s module could not be imported, or ``None``."""
    _load_entry_points()
    return _BROKEN.get(kind)
