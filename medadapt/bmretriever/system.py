"""BMRetriever's one registration: ``kind: bmretriever``, its plan, paper settings, frozen base and mining
preset (entry point ``medadapt.systems: bmretriever``)."""

from __future__ import annotations

from medadapt.bmretriever.recipe import PAPER, frozen_base, plan_spec, train
from medadapt.bmretriever.schema import BmRetrieverRecipe
from medadapt.recipes.run import evaluate_dense
from medadapt.systems import System, register_system

__all__ = ["SYSTEM"]

SYSTEM = register_system(System(
    "bmretriever", BmRetrieverRecipe, train, evaluate_dense,
    summary="BMRetriever: two-stage contrastive training of (decoder) retrievers",
    paper=PAPER, base=frozen_base, plan=plan_spec,
    # §3.3: one random passage from the top 100 of the base retriever
    mining_presets={"bmretriever": {"window": (1, 100), "num_negatives": 1}}))
