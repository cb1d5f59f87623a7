"""Trainable heads for frozen sentence-transformers embedders.

* :class:`MoEHead` / :class:`MoEConfig`: Med-MoE-Embed (shared + routed experts); the residual
  single-expert head is ``MoEConfig.single_expert(dim)``.
* Expert registry: :func:`register_expert`, :func:`build_expert`, :func:`available_experts`.
* :func:`attach` / :func:`find_head`: put a head into a ``SentenceTransformer`` and get it back.
"""

from __future__ import annotations

from medadapt.heads.attach import attach, find_head
from medadapt.heads.experts import available_experts, build_expert, expert_class, register_expert
from medadapt.heads.moe import MoEHead
from medadapt.heads.moe_config import MoEConfig
from medadapt.heads.routing import RoutingMode, TopKRouter

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
