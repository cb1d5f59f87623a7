"""Recipe kinds: which loader and runner ``medadapt train`` uses for a recipe's top-level ``kind:``.

A recipe without ``kind`` is a head / backbone recipe (:mod:`medadapt.recipes.schema`, run by
:func:`medadapt.training.run_recipe`). Other kinds live in their own packages and are imported lazily, only
when a recipe of that kind is run, so ``import medadapt`` stays light. Each entry is a function returning
``(load, run)``:

* ``load(path, overrides) -> spec`` validates the YAML (pydantic, unknown keys refused);
* ``run(spec, output_dir, *, cache, show_progress, evaluate, log) -> RunResult``.

Adding a kind: write ``medadapt/<pkg>/recipe.py`` with those two functions and add one entry below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from medadapt.errors import ConfigError

__all__ = ["RECIPE_KINDS", "recipe_kind", "resolve_kind"]

Loader = Callable[[Path, list[str]], Any]
Runner = Callable[..., Any]


def _default() -> tuple[Loader, Runner]:
    from medadapt.recipes import load_recipe
    from medadapt.training import run_recipe

    def run(spec, output_dir, *, recipe_path=None, **kwargs):
        return run_recipe(spec, output_dir, recipe_path=recipe_path, **kwargs)

    return load_recipe, run


def _care() -> tuple[Loader, Runner]:
    from medadapt.asym.recipe import load_care_recipe, run_care_recipe

    def run(spec, output_dir, *, recipe_path=None, **kwargs):
        return run_care_recipe(spec, output_dir, **kwargs)

    return load_care_recipe, run


def _bmretriever() -> tuple[Loader, Runner]:
    from medadapt.bmretriever.recipe import load_bmretriever_recipe, run_bmretriever_recipe

    return load_bmretriever_recipe, run_bmretriever_recipe


def _hyrec() -> tuple[Loader, Runner]:
    from medadapt.hyrec.recipe import load_hyrec_recipe, run_hyrec_recipe

    return load_hyrec_recipe, run_hyrec_recipe


# kind -> lazy (load, run). `None` is the head / backbone recipe without a `kind:` key.
RECIPE_KINDS: dict[str | None, Callable[[], tuple[Loader, Runner]]] = {
    None: _default,
    "care": _care,
    "hyrec": _hyrec,
    "bmretriever": _bmretriever,
}


def recipe_kind(path: str | Path) -> str | None:
    """The top-level ``kind:`` of the YAML recipe at ``path`` (``None`` when absent)."""
    from medadapt.recipes.loader import read_recipe_yaml

    kind = read_recipe_yaml(path).get("kind")
    if kind is not None and not isinstance(kind, str):
        raise ConfigError(f"{path}: 'kind' must be a string")
    return kind


def resolve_kind(path: str | Path) -> tuple[Loader, Runner]:
    """``(load, run)`` for the recipe at ``path``; an unknown kind lists the valid ones."""
    kind = recipe_kind(path)
    if kind not in RECIPE_KINDS:
        valid = ", ".join(sorted(k for k in RECIPE_KINDS if k))
        raise ConfigError(f"{path}: unknown recipe kind {kind!r} (valid: {valid}, or no 'kind' for a head recipe)")
    return RECIPE_KINDS[kind]()
