"""Med-MoE-Embed's one registration: ``kind: moe``, its plan and paper settings, the ``moe`` head type,
its mining preset and its report notes (entry point ``medadapt.systems: moe``)."""

from __future__ import annotations

from medadapt.moe.adapter import MOE_ADAPTER
from medadapt.moe.recipe import PAPER, MoERecipe, evaluate, plan_spec, train
from medadapt.systems import System, register_system

__all__ = ["SYSTEM"]


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
