"""Recipe kinds: each system registers its own ``kind:`` here, from its own package.

``medadapt train`` reads a recipe's ``kind:`` and asks :func:`get_kind`. Nothing here imports a system:
a system module calls :func:`register_kind` when it is imported, and modules that register kinds are
found through the ``medadapt.recipe_kinds`` entry-point group (``pyproject.toml``), imported only when a
kind is asked for. A fifth system (in medadapt or in another distribution) adds one entry point and one
``register_kind`` call next to its schema; no central table changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from medadapt.errors import ConfigError
from medadapt.plugins import load_group
from medadapt.recipes.base import RecipeBase

__all__ = ["RecipeKind", "get_kind", "kinds", "register_kind"]

ENTRY_POINT_GROUP = "medadapt.recipe_kinds"


@dataclass(frozen=True)
class RecipeKind:
    """A system as ``medadapt train`` sees it (``ctx`` below is the runner's
    :class:`~medadapt.recipes.run.RunContext`).

    Attributes:
        kind: the recipe's ``kind:`` value.
        schema: the pydantic recipe class (a :class:`~medadapt.recipes.base.RecipeBase` subclass).
        train: ``train(recipe, ctx) -> model``: trains and returns the model (anything with
            ``save(folder)``), filling ``ctx.result`` (losses, timings, details).
        evaluate: ``evaluate(recipe, model, ctx) -> {metric: value}`` (``None``: no evaluation).
        summary: one line for ``medadapt train --help`` and errors.
        paper: the paper's equations and hyperparameters as ``section.field: value`` overrides, with a
            reason each (``{path: (value, "paper §/eq./table")}``); ``medadapt train --paper`` /
            ``load_recipe(..., paper=True)`` applies them on top of the recipe file (``--set`` still wins).
            ``None``: the system has no paper mode.
        base: ``base(recipe, ctx) -> model | None``: the frozen base model the trained one is compared with
            (``eval.baseline``, ``eval.also``), evaluated with
            :func:`~medadapt.recipes.run.evaluate_dense`. ``None``: the trained model with its medadapt heads
            disabled when it has any, else the recipe's ``model.backbone`` when it names one.
    """

    kind: str
    schema: type[RecipeBase]
    train: Callable[[Any, Any], Any]
    evaluate: Callable[[Any, Any, Any], dict[str, float]] | None = None
    summary: str = ""
    paper: dict[str, tuple[Any, str]] | None = None
    base: Callable[[Any, Any], Any] | None = None

    def paper_settings(self) -> dict[str, Any]:
        """The paper settings as ``{"section.field": value}``; a kind without a paper mode is refused."""
        if not self.paper:
            raise ConfigError(f"recipe kind {self.kind!r} has no paper mode")
        return {path: value for path, (value, _why) in self.paper.items()}


_KINDS: dict[str, RecipeKind] = {}
_BROKEN: dict[str, str] = {}  # kind -> why its module could not be imported (a missing optional dependency)


def register_kind(kind: RecipeKind) -> RecipeKind:
    """Register (or re-register, e.g. on module reload) a recipe kind; returns it."""
    _KINDS[kind.kind] = kind
    return kind


def _broken(name: str, exc: ImportError) -> None:  # a system whose optional dependencies are missing
    _KINDS.setdefault(name, None)  # type: ignore[arg-type]
    _BROKEN[name] = str(exc)


def _load_entry_points() -> None:
    load_group(ENTRY_POINT_GROUP, _KINDS, _broken)


def kinds() -> list[str]:
    """The registered recipe kinds."""
    _load_entry_points()
    return sorted(k for k, v in _KINDS.items() if v is not None)


def get_kind(kind: Any, source: str = "recipe") -> RecipeKind:
    """The registered :class:`RecipeKind` for ``kind``; an unknown kind lists the valid ones."""
    if kind is None:
        raise ConfigError(f"{source}: no 'kind:' (valid: {', '.join(kinds())})")
    if not isinstance(kind, str):
        raise ConfigError(f"{source}: 'kind' must be a string")
    if kind not in _KINDS:
        _load_entry_points()
    if kind in _BROKEN:
        raise ConfigError(f"{source}: recipe kind {kind!r} cannot be loaded: {_BROKEN[kind]}")
    found = _KINDS.get(kind)
    if found is None:
        raise ConfigError(f"{source}: unknown recipe kind {kind!r} (valid: {', '.join(kinds())})")
    return found
