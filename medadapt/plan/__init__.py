"""``medadapt plan``: what a recipe needs (parameters, memory per device, tokens per step, gradient
accumulation) before any weight is downloaded. Systems map their recipes to models and phases (their
``System.plan``); the planner builds the architectures on the meta device (:mod:`medadapt.plan.configs`) and
applies the memory model (:mod:`medadapt.plan.memory`) on the hardware (:mod:`medadapt.plan.hardware`)::

    plan = plan_recipe(load_recipe("recipes/bmretriever-7b.yaml"), Hardware(num_gpus=8, gpu_memory_gb=80))
"""

from medadapt.plan.configs import Architecture, architecture, find_config
from medadapt.plan.hardware import Hardware, read_accelerate_config
from medadapt.plan.memory import StateBytes, activation_bytes, state_bytes, step_peak_bytes
from medadapt.plan.planner import DoesNotFit, ModelPlan, PhasePlan, Plan, describe_recipe, plan_recipe
from medadapt.plan.specs import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage

__all__ = ["Architecture", "DoesNotFit", "Hardware", "LoraSpec", "ModelPlan", "ModelSpec", "PhasePlan", "PhaseSpec",
           "Plan", "PlanSpec", "StateBytes", "Usage", "activation_bytes", "architecture", "describe_recipe",
           "find_config", "plan_recipe", "read_accelerate_config", "state_bytes",
           "step_peak_bytes"]
