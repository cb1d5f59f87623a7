"""``benchmarks/gpu_paper.py`` runs only when a GPU is lent (sessions apart): its overrides must stay valid
for every shipped paper recipe as the schemas move, and ``--accumulation`` must reach every stage the one
loop trains (a HyReC key the schema refused was found only by a CPU smoke run)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from medadapt.recipes import load_recipe

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_paper  # noqa: E402


@pytest.mark.parametrize("name", list(gpu_paper.RECIPES))
def test_overrides_validate_with_and_without_accumulation(name):
    file = ROOT / "recipes" / gpu_paper.RECIPES[name][0]
    plain = load_recipe(file, gpu_paper.overrides(name, Path("/data"), 7, False))
    accumulated = load_recipe(file, gpu_paper.overrides(name, Path("/data"), 7, False, accumulation=3))
    if name not in gpu_paper.ACCUMULATION_KEYS:
        assert accumulated == plain  # the sentence-transformers trainer paths take no --accumulation
        return
    for key in gpu_paper.ACCUMULATION_KEYS[name]:
        assert _get(accumulated, key).gradient_accumulation_steps == 3, key
        assert _get(accumulated, key).batch_size == _get(plain, key).batch_size  # BATCH stays the chunk


def _get(recipe, key):
    for part in key.split("."):
        recipe = getattr(recipe, part)
    return recipe

