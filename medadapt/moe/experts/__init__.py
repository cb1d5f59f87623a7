"""Expert networks for MoE heads. Importing this package registers every built-in expert family."""

from __future__ import annotations

from medadapt.moe.experts.kan import KANExpert, MLPKANExpert
from medadapt.moe.experts.mlp import MLPGeluExpert, MLPSwiGLUExpert
from medadapt.moe.experts.registry import available_experts, build_expert, expert_class, register_expert

__all__ = ["KANExpert", "MLPGeluExpert", "MLPKANExpert", "MLPSwiGLUExpert", "available_experts", "build_expert",
           "expert_class", "register_expert"]
