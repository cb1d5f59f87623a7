"""BMRetriever's one registration: ``kind: bmretriever``, its plan, paper settings, frozen base and mining
preset (entry point ``medadapt.systems: bmretriever``)."""

from __future__ import annotations

from pathlib import Path

from medadapt.bmretriever.plan import plan_spec
from medadapt.bmretriever.sections import BmRetrieverRecipe
from medadapt.bmretriever.train import frozen_base, train
from medadapt.recipes.run import evaluate_dense
from medadapt.systems import System, load_paper, register_system

__all__ = ["PAPER", "SYSTEM"]

#: ``medadapt train --paper``: the paper's settings, with where it states each (``paper.yaml`` here).
PAPER = load_paper(Path(__file__).with_name("paper.yaml"))

SYSTEM = register_system(System(
    "bmretriever", BmRetrieverRecipe, train, evaluate_dense,
    summary="BMRetriever: two-stage contrastive training of (decoder) retrievers",
    paper=PAPER, base=frozen_base, plan=plan_spec,
    # §3.3: one random passage from the top 100 of the base retriever
    mining_presets={"bmretriever": {"window": (1, 100), "num_negatives": 1}}))
