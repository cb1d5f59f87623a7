"""Med-MoE-Embed's one registration: ``kind: moe``, its plan and paper settings, the ``moe`` head type, its
mining preset and its report notes (entry point ``medadapt.systems: moe``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from medadapt.adapters.types import AdapterType
from medadapt.errors import ConfigError
from medadapt.moe.config import MoEConfig
from medadapt.moe.head import MoEHead
from medadapt.moe.plan import plan_spec
from medadapt.moe.sections import MoEHeadSection, MoERecipe
from medadapt.moe.train import evaluate, train
from medadapt.systems import System, load_paper, register_system

__all__ = ["MOE_ADAPTER", "PAPER", "SYSTEM"]

#: ``medadapt train --paper``: the paper's settings, with where it states each (``paper.yaml`` here).
PAPER = load_paper(Path(__file__).with_name("paper.yaml"))


def _build(config: MoEConfig | MoEHeadSection, dim: int) -> MoEHead:
    if isinstance(config, MoEHeadSection):
        config = config.to_config(dim)
    if config.dim != dim:
        raise ConfigError(f"the head config has dim={config.dim} but the backbone's embedding is {dim}-d; "
                          f"use MoEConfig(dim={dim}, ...)")
    return MoEHead(config)


def _from_dict(data: dict[str, Any], dim: int) -> MoEHead:
    return _build(MoEConfig.from_dict(data), dim)


def _describe(head: MoEHead) -> str:
    c = head.config
    n = sum(p.numel() for p in head.parameters())
    routed = f" + {len(c.routed_experts)} routed ({', '.join(c.routed_experts)}), top-{c.top_k}" \
        if c.routed_experts else ""
    scales = (f"residual scale {head.residual_scale}" if not c.domains else "residual scale by domain "
              + ", ".join(f"{d} {g:g}" for d, g in zip(c.domains, c.domain_scales)))
    return (f"Med-MoE-Embed head: {len(c.shared_experts)} shared ({', '.join(c.shared_experts)}){routed}, "
            f"expansion {c.expansion}, {scales}; {n:,} parameters")


#: the ``moe`` head type: ``model.add_adapter(MoEConfig(...))`` or a recipe's ``MoEHeadSection``
MOE_ADAPTER = AdapterType(
    name="moe", config_classes=(MoEConfig, MoEHeadSection), build=_build, from_dict=_from_dict,
    describe=_describe)


def report_notes(run, analysis) -> list[str]:
    """Why the report of a ``moe`` run shows no expert load."""
    if analysis is None:
        return ["No expert load to show: train_log.json holds none (a run trained through the backbone "
                "path, or by an older medadapt) and the model was not run on data (see the notes below)."]
    return ["This run's head routes no experts (not a Med-MoE-Embed head with routed experts): no expert "
            "load to show."]


SYSTEM = register_system(System(
    "moe", MoERecipe, train, evaluate,
    summary=("Med-MoE-Embed head on a frozen backbone (two-step schedule on cached embeddings), or "
             "backbone / LoRA fine-tuning"),
    paper=PAPER, plan=plan_spec, adapter_types=(MOE_ADAPTER,),
    mining_presets={"med-moe": {"window": (6, 10), "num_negatives": 5}},  # §IV-A: BM25 ranks 6-10, 5 negs
    report_notes=report_notes))
