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


class Section(BaseModel):
    """A typed configuration section: ``extra="forbid"``, assignments validated, finite numbers only."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="after")
    def _finite(self) -> "Section":
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, BaseModel):
                continue  # validated by its own class
            if (where := _non_finite(value, name)) is not None:
                raise ValueError(f"{where} must be a finite number")
        return self
