"""The base of every medadapt configuration: :class:`Section`, a pydantic model that refuses unknown keys and
non-finite numbers (``lr: .inf``) at validation, shared by the Python API and YAML recipes.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from medadapt.errors import ConfigError

__all__ = ["UNKNOWN_KEY", "Section", "relocated_errors", "validate_each"]

#: the error type of a key a section does not have (pydantic's ``extra_forbidden``, with a did-you-mean)
UNKNOWN_KEY = "unknown_key"

#: integers a field may hold: what torch, numpy and file formats can store (a 30-digit batch size is a typo)
_INT_LIMIT = 2**63


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN / inf in ``value`` (nested containers), or ``None``; iterative, each container
    walked once however often YAML aliases share it."""
    stack: list[tuple[Any, str]] = [(value, path)]
    seen: set[int] = set()
    while stack:
        item, where = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return where
            continue
        if not isinstance(item, (dict, list, tuple)) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            children = [(v, f"{where}.{k}" if where else str(k)) for k, v in item.items()]
        else:
            children = [(v, f"{where}[{i}]") for i, v in enumerate(item)]
        stack.extend(reversed(children))  # depth first, in order: the first NaN in reading order is named
    return None


def _non_finite_number(value: Any) -> bool:
    """NaN / inf as a float or as text pydantic would read as one (``--set training.lr=nan``)."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return False
    return isinstance(value, float) and not math.isfinite(value)


def _types(annotation: Any) -> set:
    """The plain types an annotation admits (``Optional[int]`` -> {int, NoneType}; others kept as they are)."""
    import typing

    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return set().union(*(_types(a) for a in args))
    if typing.get_origin(annotation) is typing.Annotated:
        return _types(args[0])
    return {annotation}


def relocated_errors(exc: ValidationError, prefix: tuple = ()) -> list[InitErrorDetails]:
    """``exc``'s errors located under ``prefix``, messages unchanged: how a validator re-raises a section's
    errors where the user wrote it (for :meth:`ValidationError.from_exception_data`)."""
    out: list[InitErrorDetails] = []
    for err in exc.errors():
        ctx = {k: v for k, v in (err.get("ctx") or {}).items() if isinstance(v, str) and k != "message"}
        out.append({"type": PydanticCustomError(err["type"], "{message}", {**ctx, "message": err["msg"]}),
                    "loc": (*prefix, *err["loc"]), "input": err.get("input")})
    return out


def unknown_key_error(key: str, section: type[BaseModel]) -> PydanticCustomError:
    """``key`` is not a field of ``section``: the closest field name (difflib), else the valid ones."""
    names = [field.alias or name for name, field in section.model_fields.items()]
    match = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    hint = f"did you mean {match[0]}?" if match else f"valid keys: {', '.join(names)}"
    ctx = {"suggestion": match[0] if match else "", "choices": ", ".join(names), "hint": hint}
    return PydanticCustomError(UNKNOWN_KEY, "unknown key ({hint})", ctx)


def validate_each(items: Any, section_of: Callable[[dict], type[BaseModel]], what: str) -> Any:
    """Validate each mapping of ``items`` with the section ``section_of(item)`` picks (a :class:`ConfigError`
    for an unknown kind): all items' errors together, each at its index (``branches.1.training.lr``).
    Sections built in Python pass as they are; a non-list is left to the field's type check."""
    if not isinstance(items, (list, tuple)):
        return items
    out: list[Any] = []
    errors: list[InitErrorDetails] = []
    for i, item in enumerate(items):
        if isinstance(item, BaseModel):
            out.append(item)
            continue
        if not isinstance(item, dict):
            errors.append({"type": PydanticCustomError("not_a_mapping", "{message}", {
                "message": f"a {what} is a mapping with a kind: key, not {type(item).__name__}"}),
                "loc": (i,), "input": item})
            continue
        try:
            out.append(section_of(item).model_validate(item))
        except ConfigError as exc:
            errors.append({"type": PydanticCustomError("unknown_kind", "{message}", {"message": str(exc)}),
                           "loc": (i, "kind"), "input": item.get("kind")})
        except ValidationError as exc:
            errors.extend(relocated_errors(exc, (i,)))
    if errors:
        raise ValidationError.from_exception_data(what, errors)
    return out


class Section(BaseModel):
    """A typed configuration section: ``extra="forbid"``, assignments validated, finite numbers only, and no
    ``true`` / ``false`` where a number is expected (pydantic would read ``batch_size: true`` as 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for name, field in cls.model_fields.items():
            value = data.get(name, data.get(field.alias) if field.alias else None)
            types = _types(field.annotation)
            if isinstance(value, bool):
                if bool not in types and types & {int, float}:
                    raise ValueError(f"{name} must be a number, not {str(value).lower()}")
            elif isinstance(value, int) and abs(value) >= _INT_LIMIT and int in types:
                raise ValueError(f"{name} is out of range ({len(str(abs(value)))} digits)")
            elif _non_finite_number(value) and types & {int, float}:
                raise ValueError(f"{name} must be a finite number")  # before a bound names a misleading limit
        return data

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_keys(cls, data: Any, handler: Any) -> Any:
        """pydantic's "Extra inputs are not permitted" becomes ``unknown key (did you mean <field>?)``."""
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors()
            if not any(e["type"] == "extra_forbidden" and len(e["loc"]) == 1 for e in errors):
                raise
            details = relocated_errors(exc)
            for err, detail in zip(errors, details):
                if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
                    detail["type"] = unknown_key_error(str(err["loc"][0]), cls)
            raise ValidationError.from_exception_data(exc.title, details) from None

    @model_validator(mode="after")
    def _finite(self) -> "Section":
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, BaseModel):
                continue  # validated by its own class
            if (where := _non_finite(value, name)) is not None:
                raise ValueError(f"{where} must be a finite number")
        return self
