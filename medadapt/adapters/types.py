"""Adapter types: which head configs ``SentenceTransformer.add_adapter`` accepts, and how to rebuild them.

The core registers its own heads with :func:`register_adapter_type` (``linear``, ``search_adaptor``:
:mod:`medadapt.adapters.linear`); a system lists its heads in its :class:`~medadapt.systems.System`
(``adapter_types``), found through the ``medadapt.systems`` entry points when a lookup first needs them.
Hand-written because PEFT's method registry wraps layers *inside* a transformers model (``nn.Linear``
targets), while medadapt heads act on the pooled embedding after it; see :mod:`medadapt.adapters`.
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
    """One kind of head.

    Attributes:
        name: the type's name, written into saved adapter files (``"moe"``).
        config_classes: config classes ``add_adapter`` recognises as this type (e.g. ``MoEConfig`` and the
            recipe's ``MoEHeadSection``).
        build: ``build(config, dim) -> module``: a fresh head for a backbone of width ``dim``; raises
            :class:`~medadapt.errors.ConfigError` when the config does not fit ``dim``.
        to_dict / from_dict: the config as JSON and back (``to_dict`` of a built module's config).
        config_of: the (JSON) config of a built head, as saved.
        describe: one line for model cards (``"MoE: 1 shared + 4 routed experts, top-2"``).
    """

    name: str
    config_classes: tuple[type, ...]
    build: Callable[[Any, int], Any]
    config_of: Callable[[Any], dict[str, Any]]
    from_dict: Callable[[dict[str, Any], int], Any]
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
