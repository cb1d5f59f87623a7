"""Adapter types: which head configs ``SentenceTransformer.add_adapter`` accepts, and how to rebuild them.

A system registers each head it offers as an :class:`AdapterType` (Med-MoE-Embed registers ``"moe"`` from
:mod:`medadapt.moe.adapter`). Nothing here imports a system: the modules that register types are found
through the ``medadapt.adapter_types`` entry-point group (``pyproject.toml``) and imported only when a
saved adapter names a type not yet registered. Hand-written because PEFT's method registry wraps layers
*inside* a transformers model (``nn.Linear`` targets), while medadapt heads act on the pooled embedding
after it; see :mod:`medadapt.adapters`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from medadapt.plugins import load_group, lookup


__all__ = ["AdapterType", "adapter_type", "adapter_type_of", "adapter_types", "register_adapter_type"]

ENTRY_POINT_GROUP = "medadapt.adapter_types"


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


_TYPES: dict[str, AdapterType] = {}


def register_adapter_type(kind: AdapterType) -> AdapterType:
    """Register (or re-register) an adapter type; returns it."""
    _TYPES[kind.name] = kind
    return kind


def _load_entry_points() -> None:
    load_group(ENTRY_POINT_GROUP, _TYPES)  # a type whose optional dependencies are missing stays unknown


def adapter_types() -> list[str]:
    """Names of the registered adapter types."""
    _load_entry_points()
    return sorted(_TYPES)


def adapter_type(name: str) -> AdapterType:
    """The registered type ``name``; an unknown name lists the valid ones."""
    return lookup(ENTRY_POINT_GROUP, _TYPES, name, "adapter type")


def adapter_type_of(config: Any) -> AdapterType | None:
    """The type whose config classes include ``config``'s class (``None``: not a medadapt head config, e.g.
    a PEFT ``LoraConfig``)."""
    _load_entry_points()
    return next((t for t in _TYPES.values() if isinstance(config, t.config_classes)), None)
