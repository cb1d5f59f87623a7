"""Name -> expert-class registry: each expert family registers itself with :func:`register_expert` in its own
module, :func:`build_expert` constructs one by name. Unknown names and options are rejected with the valid
choices. A registered class takes ``dim`` first and maps ``(..., dim) -> (..., dim)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from medadapt.errors import ConfigError

__all__ = ["register_expert", "build_expert", "available_experts", "expert_class", "check_expert_options"]

_EXPERTS: dict[str, type[nn.Module]] = {}

T = TypeVar("T", bound=type[nn.Module])


def register_expert(name: str) -> Callable[[T], T]:
    """Class decorator registering an expert family under ``name``, e.g. ``@register_expert("my_expert")`` on a
    module taking ``(dim, expansion=4, zero_init_output=True, ...)``."""

    def decorator(cls: T) -> T:
        existing = _EXPERTS.get(name)
        if existing is not None and existing is not cls:
            raise ValueError(f"Expert name {name!r} is already registered to {existing.__qualname__}.")
        if "dim" not in inspect.signature(cls).parameters:
            raise TypeError(f"Expert {cls.__qualname__} must accept a `dim` argument.")
        _EXPERTS[name] = cls
        cls.expert_name = name  # type: ignore[attr-defined]
        return cls

    return decorator


def available_experts() -> list[str]:
    """Sorted names of all registered experts."""
    return sorted(_EXPERTS)


def expert_class(name: str) -> type[nn.Module]:
    """The class registered under ``name``; raises ``ConfigError`` listing the valid names."""
    try:
        return _EXPERTS[name]
    except KeyError:
        raise ConfigError(f"Unknown expert {name!r}; valid names: {available_experts()}") from None


def check_expert_options(name: str, options: dict[str, Any]) -> None:
    """Raise :class:`~medadapt.errors.ConfigError` if ``name`` is unknown or ``options`` contains keywords
    its constructor does not accept (the message lists the accepted ones)."""
    accepted = [p for p in inspect.signature(expert_class(name)).parameters if p != "dim"]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(f"Expert {name!r} got unknown option(s) {unknown}; accepted: {accepted}")


def build_expert(name: str, dim: int, **kwargs: Any) -> nn.Module:
    """The expert registered under ``name`` for embeddings of width ``dim`` (unknown names or options raise
    :class:`~medadapt.errors.ConfigError` naming the valid ones)."""
    check_expert_options(name, kwargs)
    return expert_class(name)(dim, **kwargs)
