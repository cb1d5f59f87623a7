"""The base of every medadapt configuration: a pydantic model that refuses unknown keys and non-finite
numbers.

Every recipe section and every component config (training loop, heads, losses) derives from
:class:`Section`, so the Python API and a YAML recipe share one class and one set of defaults. A value of
``.nan`` / ``.inf`` anywhere (``lr: .inf``) is refused at validation time, before anything trains.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

__all__ = ["Section"]


def _non_finite(value: Any, path: str) -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        for k, v in value.items():
            if (found := _non_finite(v, f"{path}.{k}" if path else str(k))) is not None:
                return found
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if (found := _non_finite(v, f"{path}[{i}]")) is not None:
                return found
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
            elif _non_finite_number(value) and types & {int, float}:
                raise ValueError(f"{name} must be a finite number")  # before a bound names a misleading limit
        return data

    @model_validator(mode="after")
    def _finite(self) -> "Section":
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, BaseModel):
                continue  # validated by its own class
            if (where := _non_finite(value, name)) is not None:
                raise ValueError(f"{where} must be a finite number")
        return self
