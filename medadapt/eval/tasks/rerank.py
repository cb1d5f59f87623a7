"""Rerank tasks: each query's own candidates ordered by similarity; MAP@10, nDCG@10, MRR@10 from their grades.

Two file layouts: MTEB's reranking rows (``layout="mteb"``, what the suites read: :func:`load_mteb_rerank`)
and medadapt's own (``{"query", "candidates"}``, :func:`medadapt.data.load_rerank`, ``medadapt eval --task
rerank``'s default).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from medadapt.data.jsonl import iter_jsonl
from medadapt.data.rerank import RerankItem, load_rerank
from medadapt.errors import DataError
from medadapt.eval.metrics import evaluate_run
from medadapt.eval.search import prepare_for_similarity
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind
from medadapt.progress import encode_with_progress

RERANK_METRICS = ("map@10", "ndcg@10", "mrr@10")


def candidate_scores(model, queries: list[str], candidates: list[list[str]], batch_size: int = 64,
                     show_progress: bool = False) -> list[np.ndarray]:
    """Each query's similarity (the model's) to each of its own candidates: queries through ``encode_query``,
    candidates through ``encode_document``."""
    sim = getattr(model, "similarity_fn_name", "cosine")
    q = encode_with_progress(model.encode_query, queries, batch_size=batch_size, show_progress=show_progress,
                             desc="encoding queries")
    d = encode_with_progress(model.encode_document, [t for texts in candidates for t in texts],
                             batch_size=batch_size, show_progress=show_progress, desc="encoding candidates")
    q, d = (prepare_for_similarity(np.asarray(e, dtype=np.float32), sim) for e in (q, d))
    out, start = [], 0
    for i, texts in enumerate(candidates):
        out.append(d[start : start + len(texts)] @ q[i])
        start += len(texts)
    return out


def evaluate_rerank(model, items: list[RerankItem], metrics: Iterable[str] = RERANK_METRICS, batch_size: int = 64,
                    show_progress: bool = False) -> dict[str, float]:
    scores = candidate_scores(model, [it.query for it in items], [it.texts for it in items], batch_size,
                              show_progress)
    run = {f"q{i}": {f"c{j}": float(s) for j, s in enumerate(row)} for i, row in enumerate(scores)}
    qrels = {f"q{i}": {f"c{j}": g for j, g in enumerate(it.grades)} for i, it in enumerate(items)}
    return evaluate_run(qrels, run, metrics)


def load_mteb_rerank(path: str | Path) -> list[RerankItem]:
    """Read a JSONL file in MTEB's reranking layout, one row per query, ``{"query": "...", "positive": [...],
    "negative": [...]}`` (what ``datasets.load_dataset("C-MTEB/CMedQAv1-reranking")["test"].to_json(...)``
    writes): positives grade 1, negatives 0. A row in another layout, a bad field, a row without a positive or
    an empty file is a :class:`DataError` naming the file and line. (mteb reads these rows from the hub only.)"""
    path = Path(path)
    items = []
    for n, obj in iter_jsonl(path, "rerank file"):
        missing = [k for k in ("query", "positive", "negative") if k not in obj]
        if missing:
            hint = (" (this is medadapt's own rerank format, {query, candidates}; the suites read MTEB's)"
                    if "candidates" in obj else "")
            raise DataError(f"{path}:{n}: not MTEB's reranking layout: expected keys 'query', 'positive', "
                            f"'negative', missing {', '.join(repr(k) for k in missing)}; found keys "
                            f"{', '.join(repr(k) for k in obj) or 'none'}{hint}")
        query = obj["query"]
        if not isinstance(query, str) or not query.strip():
            raise DataError(f"{path}:{n}: 'query' must be a non-empty string")
        lists = {}
        for key in ("positive", "negative"):
            value = obj[key]
            if isinstance(value, str):  # some exports keep a single positive as a bare string
                value = [value]
            if not isinstance(value, list) or any(not isinstance(t, str) for t in value):
                raise DataError(f"{path}:{n}: {key!r} must be a list of strings (MTEB's reranking layout)")
            lists[key] = value
        if not lists["positive"]:
            raise DataError(f"{path}:{n}: 'positive' is empty; MAP is undefined for a query with no relevant "
                            "candidate")
        texts = lists["positive"] + lists["negative"]
        items.append(RerankItem(query, texts, [1] * len(lists["positive"]) + [0] * len(lists["negative"])))
    if not items:
        raise DataError(f"{path}: no rerank rows")
    return items


@register_task_kind
class RerankTask(EvalTask):
    kind = "rerank"
    default_metrics = RERANK_METRICS

    def read(self, path: Path):
        return load_mteb_rerank(path) if self.metadata.layout == "mteb" else load_rerank(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        metrics = evaluate_rerank(model, self.data, settings.metrics, settings.batch_size, settings.show_progress)
        return {self.metadata.query_languages[0]: metrics}
