"""Load a recipe YAML (any registered kind), with ``--set a.b=c`` overrides and
errors that name the file and the field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from medadapt.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"training.lr=1e-4"`` -> ``(["training", "lr"], 0.0001)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.field=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise ConfigError(f"override {item!r} has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set ``section.field=value`` items in ``data``; a number indexes a list (``branches.0.training.lr``)."""
    for item in overrides:
        parts, value = parse_override(item)
        _assign(data, parts, value, item)
    return data


def apply_settings(data: dict, settings: dict[str, Any]) -> dict:
    """Set ``{"section.field": value}`` items in ``data`` (values as they are, no YAML parsing)."""
    for key, value in settings.items():
        _assign(data, key.split("."), copy.deepcopy(value), key)
    return data


def _assign(data: dict, parts: list[str], value: Any, item: str) -> None:
    """Set ``value`` at the path ``parts`` of ``data`` (``item``: the override, for errors)."""
    node = data
    for p in parts[:-1]:
        if isinstance(node, list):
            node = _list_item(node, p, item)
            continue
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, (dict, list)):
            raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node = child
    if isinstance(node, list):
        node[_list_index(node, parts[-1], item)] = value
    else:
        node[parts[-1]] = value


def _list_index(items: list, part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"override {item!r}: {part!r} is not an index of a {len(items)}-item list")
    return int(part)


def _list_item(items: list, part: str, item: str):
    child = items[_list_index(items, part, item)]
    if not isinstance(child, (dict, list)):
        raise ConfigError(f"override {item!r}: item {part} is not a section")
    return child


def format_validation_error(source: str, exc: ValidationError) -> str:
    msgs = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"])
        msgs.append(f"{loc or '<root>'}: {err['msg']}")
    return f"{source}: invalid recipe: " + "; ".join(msgs)


def read_recipe_yaml(path: str | Path) -> dict:
    """The YAML mapping of a recipe file; a missing file, bytes that are not UTF-8, invalid YAML (with its
    line) or a non-mapping raises :class:`~medadapt.errors.ConfigError`. Shared by every recipe kind."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not valid UTF-8 (byte offset {exc.start}); "
                          "save the recipe as UTF-8") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: invalid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping of sections")
    return data


def load_recipe(path_or_data: str | Path | dict, overrides: list[str] | None = None, *,
                expect: type[M] | None = None, paper: bool = False) -> M:
    """Read a recipe (a YAML file or a dict), apply ``section.field=value`` overrides and validate it against
    the schema its ``kind:`` registered (:mod:`medadapt.recipes.registry`); ``expect`` additionally
    requires that schema. ``paper=True`` first applies the kind's paper settings
    (:attr:`~medadapt.recipes.registry.RecipeKind.paper`: the paper's equations and hyperparameters), then
    ``overrides``. Every problem is one :class:`~medadapt.errors.ConfigError` naming the file and the
    field."""
    from medadapt.recipes.registry import get_kind

    source = "<dict>" if isinstance(path_or_data, dict) else str(path_or_data)
    data = copy.deepcopy(path_or_data) if isinstance(path_or_data, dict) else read_recipe_yaml(path_or_data)
    if paper:
        data = apply_settings(data, get_kind(data.get("kind"), source).paper_settings())
    data = apply_overrides(data, list(overrides or []))
    schema = get_kind(data.get("kind"), source).schema
    if expect is not None and not issubclass(schema, expect):
        raise ConfigError(f"{source}: a {data.get('kind')!r} recipe, not a {expect.__name__}")
    try:
        recipe = schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc)) from None
    recipe._source = None if isinstance(path_or_data, dict) else str(path_or_data)
    return recipe


recipe_from_dict = load_recipe


def resolve_path(value: str, recipe_path: str | Path | None) -> Path:
    """Resolve a relative path in a recipe: against the current directory if it exists there, else
    against the recipe file's folder. Builtin dataset names (``medmini``) are returned as they are."""
    from medadapt.data.builtin import is_builtin_dataset

    if is_builtin_dataset(value):
        return Path(value)
    p = Path(value).expanduser()
    if p.is_absolute() or p.exists() or recipe_path is None:
        return p
    alt = Path(recipe_path).resolve().parent / p
    return alt if alt.exists() else p
