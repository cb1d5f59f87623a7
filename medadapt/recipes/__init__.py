"""Recipes: validated YAML schemas whose sections map one-to-one to medadapt classes."""

from medadapt.recipes.loader import apply_overrides, load_recipe, recipe_from_dict, resolve_path
from medadapt.recipes.schema import SCHEMA_VERSION, Recipe

__all__ = ["Recipe", "SCHEMA_VERSION", "apply_overrides", "load_recipe", "recipe_from_dict", "resolve_path"]
