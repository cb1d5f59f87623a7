"""Med-MoE-Embed: a mixture-of-experts head on a frozen sentence-transformers backbone (paper §III).

* :class:`MoEHead` / :class:`MoEConfig` (:mod:`medadapt.moe.head`, :mod:`medadapt.moe.config`): shared
  plus top-k routed experts, saved with the model; :class:`TopKRouter` (:mod:`medadapt.moe.routing`);
  the expert registry (:mod:`medadapt.moe.experts`: :func:`register_expert`, :func:`build_expert`).
* :mod:`medadapt.moe.schedule`: the two-step training schedule as stages of the one loop
  (:func:`train_head` on cached embeddings, :func:`encode_with_head`).
* :mod:`medadapt.moe.backbone`: the backbone / LoRA path (the head trained jointly) as a stage of the same
  loop.
* :mod:`medadapt.moe.sections`: the ``head`` / ``loss`` / ``training`` sections (the configs of both the
  Python API and the recipe).
* :mod:`medadapt.moe.recipe`: the ``kind: moe`` recipe (:class:`MoERecipe`) behind ``medadapt train``.
* :mod:`medadapt.moe.system`: the one :func:`~medadapt.systems.register_system` call.
"""

from __future__ import annotations

import medadapt.moe.system  # noqa: F401  (registers Med-MoE-Embed: its kind, the "moe" head type, ...)
from medadapt.moe.config import MoEConfig
from medadapt.moe.experts import available_experts, build_expert, expert_class, register_expert
from medadapt.moe.head import MoEHead
from medadapt.moe.recipe import MoERecipe
from medadapt.moe.routing import RoutingMode, TopKRouter
from medadapt.moe.schedule import HeadTrainResult, encode_with_head, head_stages, train_head
from medadapt.moe.sections import InfoNCESection, MoEHeadSection, MoETrainingSection, NoHead

__all__ = [
    "HeadTrainResult",
    "InfoNCESection",
    "MoEConfig",
    "MoEHead",
    "MoEHeadSection",
    "MoERecipe",
    "MoETrainingSection",
    "NoHead",
    "RoutingMode",
    "TopKRouter",
    "available_experts",
    "build_expert",
    "encode_with_head",
    "expert_class",
    "head_stages",
    "register_expert",
    "train_head",
]
