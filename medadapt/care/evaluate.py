"""Evaluate and time asymmetric models. Scoring is the one evaluation path (:func:`medadapt.eval.tasks.evaluate`):
queries through the query tower, the corpus through the document route via the embedding cache, keyed by that
route's own modules (a document tower cached as a standalone model costs no encode)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from medadapt.adapters.compose import branch_kind
from medadapt.care.model import build_document_tower
from medadapt.care.sections import CareRecipe
from medadapt.eval.tasks import evaluate as evaluate_task
from medadapt.eval.tasks import task_kind
from medadapt.recipes.run import evaluate_dense

if TYPE_CHECKING:
    from medadapt.recipes.run import RunContext

__all__ = ["evaluate", "evaluate_asymmetric", "frozen_base", "query_speed"]


def evaluate_asymmetric(model, data, split: str = "test", metrics: Iterable[str] = ("ndcg@10",), cache=None,
                        batch_size: int = 64, show_progress: bool = False) -> dict[str, float]:
    """The metrics of an asymmetric model (or any SentenceTransformer) on a split of ``data`` (a loaded
    :class:`~medadapt.data.beir.BeirDataset`), dense, through :func:`medadapt.eval.tasks.evaluate`."""
    task = task_kind("retrieval").create("beir").load_data(data, split)
    return evaluate_task(model, task, metrics=list(metrics), mode="dense", cache=cache, batch_size=batch_size,
                         show_progress=show_progress).metrics


def evaluate(recipe: CareRecipe, model, ctx: RunContext) -> dict[str, float]:
    """The trained model on ``eval.data`` / ``eval.split`` (:func:`~medadapt.recipes.run.evaluate_dense`); a
    composed model (``branches``) is evaluated by its last branch (``lexical/``, ``dense/``, ``hybrid/``)."""
    if recipe.branches:
        return branch_kind(recipe.branches[-1].kind).evaluate(recipe, model, recipe.branches[-1], ctx)
    return evaluate_dense(recipe, model, ctx)


def frozen_base(recipe: CareRecipe, ctx: RunContext):
    """The base a CARE run is compared with (``eval.baseline``, ``eval.also``): the untrained document tower,
    symmetric (both roles through it)."""
    return build_document_tower(recipe.document, device=ctx.device)


def query_speed(encode: Callable[[list[str]], object], queries: Sequence[str], *, batch_size: int = 64,
                latency_samples: int = 200, warmup: int = 5, repeats: int = 1) -> dict[str, float]:
    """Throughput and latency of ``encode`` (e.g. ``model.encode_query``): ``qps`` encoding all ``queries`` in
    batches (best of ``repeats``), ``p50_ms`` / ``p90_ms`` single-query latency over ``latency_samples``."""
    queries = list(queries)
    for text in queries[:warmup]:
        encode([text])
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        for begin in range(0, len(queries), batch_size):
            encode(queries[begin : begin + batch_size])
        best = min(best, time.perf_counter() - start)
    lat = []
    for text in queries[:latency_samples]:
        start = time.perf_counter()
        encode([text])
        lat.append((time.perf_counter() - start) * 1000)
    lat.sort()
    return {"qps": len(queries) / best, "p50_ms": statistics.median(lat),
            "p90_ms": lat[min(len(lat) - 1, int(0.9 * len(lat)))]}
