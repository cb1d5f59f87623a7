"""CARE's one registration: ``kind: care``, its plan, paper settings and frozen base (entry point
``medadapt.systems: care``)."""

from __future__ import annotations

from medadapt.care.recipe import PAPER, CareRecipe, evaluate, frozen_base, plan_spec, train
from medadapt.systems import System, register_system

__all__ = ["SYSTEM"]

SYSTEM = register_system(System(
    "care", CareRecipe, train, evaluate,
    summary="CARE asymmetric retrieval: small query tower aligned to a large document tower",
    paper=PAPER, base=frozen_base, plan=plan_spec))
