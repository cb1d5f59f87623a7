"""Adapter types: which head configs ``SentenceTransformer.add_adapter`` accepts, and how to rebuild them.

The core registers its own heads with :func:`register_adapter_type` (:mod:`medadapt.adapters.linear`); a system
lists its heads in its :class:`~medadapt.systems.System` (``adapter_types``). Hand-written because PEFT's method
registry wraps layers *inside* a transformers model, while medadapt heads act on the pooled embedding after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from medadapt import systems
from medadapt.errors import ConfigError

__all__ = ["AdapterType", "adapter_type", "adapter_type_of", "adapter_types", "register_adapter_type"]


@dataclass(frozen=True)
class AdapterType:
    """One kind of head: its ``name`` (written into saved adapter files), the ``config_classes`` ``add_adapter``
    recognises, ``build(config, dim)`` (a fresh head for a ``dim``-wide backbone; ``ConfigError`` when the config
    does not fit), ``from_dict(config, dim)`` (a saved head back), ``config_of(head)`` (its JSON config as saved;
    default ``head.get_config_dict()``) and ``describe(head)`` (one line for model cards)."""

    name: str
    config_classes: tuple[type, ...]
    build: Callable[[Any, int], Any]
    from_dict: Callable[[dict[str, Any], int], Any]
    config_of: Callable[[Any], dict[str, Any]] = lambda head: head.get_config_dict()
    describe: Callable[[Any], str] = lambda module: type(module).__name__


_TYPES: dict[str, AdapterType] = {}  # the core's own heads


def register_adapter_type(kind: AdapterType) -> AdapterType:
    """Register (or re-register) a core adapter type; returns it (a system lists its types in its
    :class:`~medadapt.systems.System` instead)."""
    _TYPES[kind.name] = kind
    return kind


def _all() -> dict[str, AdapterType]:
    """Every adapter type: the systems' (entry points loaded first), then the core's."""
    return {**{t.name: t for s in systems.registered() for t in s.adapter_types}, **_TYPES}


def adapter_types() -> list[str]:
    """Names of the registered adapter types."""
    return sorted(_all())


def adapter_type(name: str) -> AdapterType:
    """The registered type ``name``; an unknown name lists the valid ones."""
    found = _TYPES.get(name) or _all().get(name)
    if found is None:
        raise ConfigError(f"unknown adapter type {name!r} (valid: {', '.join(adapter_types()) or 'none'})")
    return found


def adapter_type_of(config: Any) -> AdapterType | None:
    """The type whose config classes include ``config``'s class (``None``: not a medadapt head config, e.g.
    a PEFT ``LoraConfig``)."""
    return next((t for t in _all().values() if isinstance(config, t.config_classes)), None)
