"""Recipes: typed YAML schemas (one per system, all extending :class:`RecipeBase`), the kind registry and
the one runner behind ``medadapt train``."""

from medadapt.recipes.base import SCHEMA_VERSION, DataSection, EvalSection, LoraSection, RecipeBase, RunSection
from medadapt.recipes.loader import apply_overrides, load_recipe, recipe_from_dict, resolve_path
from medadapt.recipes.registry import RecipeKind, get_kind, kinds, register_system
from medadapt.recipes.run import RunContext, RunResult, run_recipe

__all__ = [
    "SCHEMA_VERSION", "DataSection", "EvalSection", "LoraSection", "RecipeBase", "RecipeKind", "RunContext",
    "RunResult", "RunSection", "apply_overrides", "get_kind", "kinds", "load_recipe", "recipe_from_dict",
    "register_system", "resolve_path", "run_recipe",
]
