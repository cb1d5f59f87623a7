"""Evaluate and time asymmetric models.

:func:`evaluate_asymmetric` scores a Router model the way it is served: the corpus through the document
tower **via the EmbeddingCache** (keyed by the document route's own modules, so a document tower already
cached as a standalone model, e.g. the packaged MiniLM, costs no encode), queries through the query tower.
:func:`query_speed` measures queries/second (batched) and median single-query latency of any encoder.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from medadapt.care.model import is_asymmetric, tower
from medadapt.cache import EmbeddingCache
from medadapt.eval.metrics import evaluate_run, parse_metric
from medadapt.eval.retrieval import dense_run

__all__ = ["evaluate_asymmetric", "query_speed"]


def evaluate_asymmetric(model, data, split: str = "test", metrics: Iterable[str] = ("ndcg@10",), cache=None,
                        batch_size: int = 64, show_progress: bool = False, cache_queries: bool = False):
    """nDCG etc. of an asymmetric model (or any SentenceTransformer) on a BEIR split.

    Documents: ``cache.encode(tower(model, "document"), ..., role="document")``. Queries: encoded directly
    by the query tower (``cache_queries=False``, so trained-and-discarded query towers do not fill the cache)
    or through the cache.
    """
    cache = cache if cache is not None else EmbeddingCache()
    metrics = list(metrics)
    q_model = tower(model, "query") if is_asymmetric(model) else model
    d_model = tower(model, "document") if is_asymmetric(model) else model
    queries = data.split_queries(split)
    qids = list(queries)
    texts = [queries[q] for q in qids]
    if cache_queries:
        q = cache.encode(q_model, texts, role="query", batch_size=batch_size, show_progress=show_progress)
    else:
        q = q_model.encode_query(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    d = cache.encode(d_model, data.doc_texts(), role="document", batch_size=batch_size,
                     show_progress=show_progress, desc="encoding corpus (document tower)")
    depth = max([parse_metric(m)[1] for m in metrics] + [100])
    run = dense_run(qids, np.asarray(q, dtype=np.float32), data.doc_ids, d, depth, "cosine")
    return evaluate_run(data.qrels[split], run, metrics)


def query_speed(encode: Callable[[list[str]], object], queries: Sequence[str], *, batch_size: int = 64,
                latency_samples: int = 200, warmup: int = 5, repeats: int = 1) -> dict[str, float]:
    """Throughput and latency of ``encode`` (e.g. ``model.encode_query``) on ``queries``.

    Returns ``qps`` (queries/second encoding all ``queries`` in batches of ``batch_size``, best of
    ``repeats``) and ``p50_ms`` / ``p90_ms`` (single-query latency over ``latency_samples`` queries).
    """
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
