"""``medadapt plan``: what a recipe needs (parameters, memory per device, tokens per step, gradient
accumulation) before any weight is downloaded.

Neutral package: systems say how their recipes map to models and phases (the ``plan`` of their
:class:`~medadapt.systems.System`); the planner builds the named architectures on the meta
device from their ``config.json`` (:mod:`medadapt.plan.configs`) and applies the memory model of
:mod:`medadapt.plan.memory` on the hardware of :mod:`medadapt.plan.hardware`.

Example::

    from medadapt.plan import Hardware, plan_recipe
    from medadapt.recipes import load_recipe
    plan = plan_recipe(load_recipe("recipes/bmretriever-7b.yaml"), Hardware(num_gpus=8, gpu_memory_gb=80))
    print(plan.to_markdown())
"""

from medadapt.plan.configs import Architecture, architecture, find_config
from medadapt.plan.hardware import Hardware, read_accelerate_config
from medadapt.plan.memory import StateBytes, activation_bytes, state_bytes, step_peak_bytes
from medadapt.plan.planner import (
                                   DoesNotFit,
                                   ModelPlan,
                                   PhasePlan,
                                   Plan,
                                   describe_recipe,
                                   plan_recipe,
)
from medadapt.plan.specs import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage

__all__ = ["Architecture", "DoesNotFit", "Hardware", "LoraSpec", "ModelPlan", "ModelSpec", "PhasePlan", "PhaseSpec",
           "Plan", "PlanSpec", "StateBytes", "Usage", "activation_bytes", "architecture", "describe_recipe",
           "find_config", "plan_recipe", "read_accelerate_config", "state_bytes",
           "step_peak_bytes"]
