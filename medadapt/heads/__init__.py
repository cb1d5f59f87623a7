"""Trainable heads for frozen sentence-transformers embedders.

* :func:`attach` / :func:`find_head`: put a head into a ``SentenceTransformer`` and get it back (any head).
* :mod:`medadapt.heads.kan`: Kolmogorov-Arnold layers (used by the KAN experts).
* Med-MoE-Embed lives in its own package, :mod:`medadapt.moe`; its names are re-exported here:
  :class:`MoEHead` / :class:`MoEConfig` (the residual single-expert head is ``MoEConfig.single_expert(dim)``),
  the expert registry (:func:`register_expert`, :func:`build_expert`, :func:`available_experts`) and the
  router (:class:`TopKRouter`, :data:`RoutingMode`).

The re-exports are resolved lazily (:mod:`medadapt.moe` itself imports :mod:`medadapt.heads.kan`, so an
eager import here would be a cycle).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from medadapt.heads.attach import attach, find_head

if TYPE_CHECKING:  # pragma: no cover
    from medadapt.moe.config import MoEConfig
    from medadapt.moe.experts import available_experts, build_expert, expert_class, register_expert
    from medadapt.moe.head import MoEHead
    from medadapt.moe.routing import RoutingMode, TopKRouter

__all__ = [
    "MoEConfig",
    "MoEHead",
    "RoutingMode",
    "TopKRouter",
    "attach",
    "available_experts",
    "build_expert",
    "expert_class",
    "find_head",
    "register_expert",
]

_MOE = {
    "MoEConfig": "medadapt.moe.config",
    "MoEHead": "medadapt.moe.head",
    "RoutingMode": "medadapt.moe.routing",
    "TopKRouter": "medadapt.moe.routing",
    "available_experts": "medadapt.moe.experts",
    "build_expert": "medadapt.moe.experts",
    "expert_class": "medadapt.moe.experts",
    "register_expert": "medadapt.moe.experts",
}


def __getattr__(name: str) -> Any:
    if name in _MOE:
        import importlib

        return getattr(importlib.import_module(_MOE[name]), name)
    raise AttributeError(f"module 'medadapt.heads' has no attribute {name!r}")
