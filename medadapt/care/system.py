"""CARE's one registration: ``kind: care``, its plan, paper settings and frozen base (entry point
``medadapt.systems: care``)."""

from __future__ import annotations

from pathlib import Path

from medadapt.care.evaluate import evaluate, frozen_base
from medadapt.care.plan import plan_spec
from medadapt.care.sections import CareRecipe
from medadapt.care.train import train
from medadapt.systems import System, load_paper, register_system

__all__ = ["PAPER", "SYSTEM"]

#: ``medadapt train --paper``: the paper's settings, with where it states each (``paper.yaml`` here).
PAPER = load_paper(Path(__file__).with_name("paper.yaml"))

SYSTEM = register_system(System(
    "care", CareRecipe, train, evaluate,
    summary="CARE asymmetric retrieval: small query tower aligned to a large document tower",
    paper=PAPER, base=frozen_base, plan=plan_spec))
