"""The built-in linear head types, ``linear`` and ``search_adaptor`` (:mod:`medadapt.heads.linear`), as
adapter types: ``model.add_adapter(LinearHeadConfig())`` / ``SearchAdaptorConfig()``, a ``moe`` recipe's
``head: {kind: linear}`` / ``{kind: search_adaptor}``, adapter-only and full folders."""

from __future__ import annotations

from typing import Any

from medadapt.adapters.types import AdapterType, register_adapter_type
from medadapt.errors import ConfigError
from medadapt.heads.linear import (LinearHead, LinearHeadConfig, SearchAdaptorConfig, SearchAdaptorHead,
                                   build_linear_head)

__all__ = ["LINEAR_ADAPTER", "SEARCH_ADAPTOR_ADAPTER"]


def _from_dict(cls):
    def build(data: dict[str, Any], dim: int):
        data = dict(data)
        saved = data.pop("dim", dim)
        if saved != dim:
            raise ConfigError(f"the saved {cls.__name__} is {saved}-d but the embedding is {dim}-d")
        unknown = sorted(set(data) - set(cls.config_keys))
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} config keys {unknown} (valid: {cls.config_keys})")
        return cls(dim, **data)
    return build


def _parameters(head) -> int:
    return sum(p.numel() for p in head.parameters())


LINEAR_ADAPTER = register_adapter_type(AdapterType(
    name="linear", config_classes=(LinearHeadConfig,), build=build_linear_head,
    config_of=lambda head: head.get_config_dict(), from_dict=_from_dict(LinearHead),
    describe=lambda head: (f"linear head W e{' + b' if head.bias else ''} (identity-initialised, "
                           f"{head.dim}x{head.dim}); {_parameters(head):,} parameters")))

SEARCH_ADAPTOR_ADAPTER = register_adapter_type(AdapterType(
    name="search_adaptor", config_classes=(SearchAdaptorConfig,), build=build_linear_head,
    config_of=lambda head: head.get_config_dict(), from_dict=_from_dict(SearchAdaptorHead),
    describe=lambda head: (f"Search-Adaptor head e + {head.scale:g}·(W e{' + b' if head.bias else ''}) "
                           f"(W zero-initialised, drift weight {head.drift_weight:g}); "
                           f"{_parameters(head):,} parameters")))
