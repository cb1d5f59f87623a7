"""Med-MoE-Embed: a mixture-of-experts head on a frozen sentence-transformers backbone (paper §III).

* :mod:`.head` / :mod:`.config`: :class:`MoEHead` / :class:`MoEConfig`, shared plus top-k routed experts
  (:mod:`.routing`, :mod:`.experts` with the KAN layers of :mod:`.kan`), saved with the model; :mod:`.domains`:
  a residual scale per domain.
* :mod:`.schedule`: the two-step schedule as stages of the one loop (:func:`train_head` on cached embeddings).
* :mod:`.sections`: the ``kind: moe`` recipe and its sections; :mod:`.train`: its phases; :mod:`.plan`;
  :mod:`.peers`: baselines trained in the same run; :mod:`.system`: the one registration.
"""

from __future__ import annotations

import medadapt.moe.system  # noqa: F401  (registers Med-MoE-Embed: its kind, the "moe" head type, ...)
from medadapt.moe.config import MoEConfig
from medadapt.moe.experts import available_experts, build_expert, expert_class, register_expert
from medadapt.moe.head import MoEHead
from medadapt.moe.routing import RoutingMode, TopKRouter
from medadapt.moe.schedule import HeadTrainResult, encode_with_head, head_stages, train_head
from medadapt.moe.sections import InfoNCESection, MoEHeadSection, MoERecipe, MoETrainingSection, NoHead

__all__ = ["HeadTrainResult", "InfoNCESection", "MoEConfig", "MoEHead", "MoEHeadSection", "MoERecipe",
           "MoETrainingSection", "NoHead", "RoutingMode", "TopKRouter", "available_experts", "build_expert",
           "encode_with_head", "expert_class", "head_stages", "register_expert", "train_head"]
