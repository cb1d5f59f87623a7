"""Load a recipe YAML (any registered kind) with ``--set a.b=c`` overrides, under the YAML input policy
(:mod:`medadapt.yaml_input`); every error names the file and line, or the ``--set`` item, and the field (an
unknown key with a did-you-mean from the schema).
"""

from __future__ import annotations

import copy
import re
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from yaml.nodes import Node

from medadapt.config import UNKNOWN_KEY
from medadapt.errors import ConfigError
from medadapt.recipes.base import resolve_path  # noqa: F401 - re-exported
from medadapt.recipes.registry import get_kind
from medadapt.yaml_input import PolicyLoader, YamlPolicyError, first_clause, has_surrogate, line_of, read_yaml

M = TypeVar("M", bound=BaseModel)


# ------------------------------------------------------------------------------------------------ overrides
def parse_override(item: str) -> tuple[list[str], Any]:
    """``"training.lr=1e-4"`` -> ``(["training", "lr"], 0.0001)``: the value parsed as YAML (invalid YAML as
    text); a malformed item or a policy breach is a :class:`ConfigError` naming ``--set <item>``."""
    flag = f"--set {item}"
    if has_surrogate(item):  # undecodable bytes on the command line arrive as lone surrogates
        raise ConfigError(f"{flag!r}: not valid UTF-8 text")
    if "=" not in item:
        raise ConfigError(f"{flag}: must look like section.field=value")
    key, raw = item.split("=", 1)
    parts = [p for p in key.strip().split(".")]
    if not all(parts):
        raise ConfigError(f"{flag}: the key {key.strip()!r} has an empty part")
    if not raw.strip():
        return parts, ""
    loader = None
    try:
        loader = PolicyLoader(raw)
        return parts, loader.get_single_data()
    except YamlPolicyError as exc:
        raise ConfigError(f"{flag}: {exc.problem}") from None
    except yaml.YAMLError:
        return parts, raw
    except (ValueError, OverflowError, RecursionError) as exc:
        raise ConfigError(f"{flag}: {first_clause(exc)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Set ``section.field=value`` items in ``data``; a number indexes a list (``branches.0.training.lr``)."""
    for item in overrides:
        parts, value = parse_override(item)
        _assign(data, parts, value, f"--set {item}")
    return data


def apply_settings(data: dict, settings: dict[str, Any]) -> dict:
    """Set ``{"section.field": value}`` items in ``data`` (values as they are, no YAML parsing)."""
    for key, value in settings.items():
        _assign(data, key.split("."), copy.deepcopy(value), key)
    return data


def _assign(data: dict, parts: list[str], value: Any, item: str) -> None:
    """Set ``value`` at the path ``parts`` of ``data`` (``item``: the override, for errors)."""
    node = data
    for depth, p in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = _list_item(node, p, item)
            continue
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        if not isinstance(child, (dict, list)):
            where = ".".join(parts[:depth + 1])
            raise ConfigError(f"{item}: {where} is a value ({child!r}), not a section")
        node = child
    if isinstance(node, list):
        node[_list_index(node, parts[-1], item)] = value
    else:
        node[parts[-1]] = value


def _list_index(items: list, part: str, item: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"{item}: {part!r} is not an index of a {len(items)}-item list")
    return int(part)


def _list_item(items: list, part: str, item: str):
    child = items[_list_index(items, part, item)]
    if not isinstance(child, (dict, list)):
        raise ConfigError(f"{item}: item {part} is not a section")
    return child


# ------------------------------------------------------------------------------------------------ errors
def user_path(loc: tuple, data: Any) -> list:
    """A pydantic error location as the user wrote the key path: a discriminated union's tag (the ``kind`` of
    the mapping, not a key of ``data``) is dropped (``head.moe.residual_scal`` -> ``head.residual_scal``)."""
    out: list = []
    node = data
    for i, seg in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict):
            if seg in node:
                out.append(seg)
                node = node[seg]
                continue
            if isinstance(seg, str) and node.get("kind") == seg:
                continue  # also last: an error of the union member's own validator (head.moe -> head)
        elif isinstance(node, str) and not last and seg == node:
            continue  # a bare name standing for {kind: name} (eval.peers: [linear_query])
        elif isinstance(node, (list, tuple)) and isinstance(seg, int) and 0 <= seg < len(node):
            out.append(seg)
            node = node[seg]
            continue
        out.append(seg)
        node = None
    return out


def _node_at(data: Any, path: list) -> Any:
    """The value at ``path`` (keys and list indices) of ``data``, ``None`` when there is none."""
    for part in path:
        found = (isinstance(data, dict) and part in data) or (
            isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data))
        if not found:
            return None
        data = data[part]
    return data


def _sections(schema: type[BaseModel] | None) -> dict[str, type[BaseModel]]:
    """The top-level fields of ``schema`` that are one section class (``X`` or ``X | None``)."""
    out = {}
    for name, field in (schema.model_fields if schema is not None else {}).items():
        kinds = [a for a in (typing.get_args(field.annotation) or (field.annotation,)) if a is not type(None)]
        if len(kinds) == 1 and isinstance(kinds[0], type) and issubclass(kinds[0], BaseModel):
            out[name] = kinds[0]
    return out


def _describe(err: dict, path: list, data: Any = None, schema: type[BaseModel] | None = None) -> str:
    """One error as a line fragment: ``unknown key head.x (did you mean head.y?)`` (else another section's
    field of that name, else the section's valid keys) or ``path: message``."""
    dotted = ".".join(str(p) for p in path)
    if err["type"] in (UNKNOWN_KEY, "extra_forbidden"):
        ctx = err.get("ctx") or {}
        parent = ".".join(str(p) for p in path[:-1])
        key = str(path[-1]) if path else ""
        elsewhere = [f"{name}.{key}" for name, section in _sections(schema).items()
                     if key in section.model_fields and name != (path[0] if len(path) > 1 else None)]
        if ctx.get("suggestion"):
            hint = f"did you mean {parent + '.' if parent else ''}{ctx['suggestion']}?"
        elif elsewhere:
            hint = f"did you mean {' or '.join(elsewhere)}?"
        elif ctx.get("choices"):
            kind = _node_at(data, path[:-1])
            kind = kind.get("kind") if isinstance(kind, dict) else None
            of = f" of {parent}" + (f" (kind {kind})" if isinstance(kind, str) else "") if parent else ""
            hint = f"valid keys{of}: {ctx['choices']}"
        else:
            hint = "not a field here"
        return f"unknown key {dotted} ({hint})"
    msg = err["msg"]
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    return f"{dotted}: {msg}" if dotted else msg  # an error of the whole recipe names its fields itself


def _override_for(path: list, msg: str, unknown: bool, overrides: list[tuple[list[str], str]]) -> str | None:
    """The last ``--set`` item an error at ``path`` is about: it set ``path`` or a section holding it, or set
    something inside ``path`` that is ``unknown`` (``--set trainin.lr=1``) or that the message names."""
    keys = [str(p) for p in path]
    if not keys:
        return None  # an error of the whole recipe (fields that do not go together): not one item's
    for parts, item in reversed(overrides):
        if keys[:len(parts)] == parts:
            return item
        if parts[:len(keys)] == keys and (unknown or re.search(rf"\b{re.escape(parts[len(keys)])}\b", msg)):
            return item
    return None


def format_validation_error(source: str, exc: ValidationError, data: Any = None, *, root: Node | None = None,
                            overrides: list[str] = (), schema: type[BaseModel] | None = None) -> str:
    """``exc`` as one line: errors of ``--set`` items first (``--set <item>: ...``), then
    ``<source>[:line]: invalid recipe: ...`` (``(line N)`` after an error on another line), with key paths as
    the user wrote them (``data``: the validated input)."""
    parsed = []
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        parsed.append(([p for p in key.split(".")], item))
    from_set: list[str] = []
    from_file: list[tuple[int | None, str]] = []
    for err in exc.errors():
        path = user_path(tuple(err["loc"]), data)
        text = _describe(err, path, data, schema)
        item = _override_for(path, text, err["type"] in (UNKNOWN_KEY, "extra_forbidden"), parsed)
        if item is not None:
            from_set.append(f"--set {item}: {text}")
            continue
        named = [f"--set {i}" for parts, i in parsed if not path and len(parts) > 1 and re.search(
            rf"(?<![\w.]){re.escape('.'.join(parts))}(?![\w])", text)]  # a field path, not a word like "head"
        if named:  # an error of the whole recipe that names fields a --set item changed
            text += f" (with {', '.join(named)})"
        from_file.append((line_of(root, path), text))
    from_file.sort(key=lambda e: (e[0] is None, e[0] or 0))  # reading order: the first line heads the message
    first_line = from_file[0][0] if from_file else None
    parts = list(from_set)
    if from_file:
        texts = [text if line is None or line == first_line else f"{text} (line {line})"
                 for line, text in from_file]
        parts.append(f"{source}{f':{first_line}' if first_line else ''}: invalid recipe: " + "; ".join(texts))
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------ loading
def _read_recipe(path: str | Path) -> tuple[dict, Node | None]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"recipe not found: {path}")
    data, root = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a YAML mapping of sections")
    return data, root


def read_recipe_yaml(path: str | Path) -> dict:
    """The YAML mapping of a recipe file; a bad file is one :class:`ConfigError` (with its line)."""
    return _read_recipe(path)[0]


def load_recipe(path_or_data: str | Path | dict, overrides: list[str] | None = None, *,
                expect: type[M] | None = None, paper: bool = False) -> M:
    """Read a recipe (a YAML file or a dict), apply the kind's paper settings (``paper=True``) then the
    ``--set`` ``overrides``, and validate it against the schema its ``kind:`` registered (``expect``: that
    schema must be a subclass of it). Every problem is one :class:`ConfigError`."""
    source = "<dict>" if isinstance(path_or_data, dict) else str(path_or_data)
    if isinstance(path_or_data, dict):
        data, root = copy.deepcopy(path_or_data), None
    else:
        data, root = _read_recipe(path_or_data)
    if paper:
        data = apply_settings(data, get_kind(data.get("kind"), source).paper_settings())
    items = list(overrides or [])
    data = apply_overrides(data, items)
    kind_set = [i for i in items if i.split("=", 1)[0].strip() == "kind"]
    schema = get_kind(data.get("kind"), f"--set {kind_set[-1]}" if kind_set else source).schema
    if expect is not None and not issubclass(schema, expect):
        raise ConfigError(f"{source}: a {data.get('kind')!r} recipe, not a {expect.__name__}")
    try:
        recipe = schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(source, exc, data, root=root, overrides=items,
                                                          schema=schema)) from None
    recipe._source = None if isinstance(path_or_data, dict) else str(path_or_data)
    return recipe


recipe_from_dict = load_recipe
