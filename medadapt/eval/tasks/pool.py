"""Pool-ranking tasks of BMRetriever's evaluation (§4, Table 10): biomedical QA and entity linking.

Each query is ranked against a **shared pool**, the union of every line's positives and optional negatives
(identical texts are one entry). File format, JSONL, one query per line::

    {"query": "What does metformin treat?", "positives": ["Metformin lowers blood glucose ..."],
     "negatives": ["Aspirin is ..."]}            # "negatives" optional: extra distractors in the pool
    {"query": "...", "positives": ["...", "..."], "id": "q17"}   # "id" optional (default: line number)

Kinds ``qa`` (Recall@5, Recall@20, nDCG@20) and ``entity-linking`` (Recall@1, Recall@5, MRR@5) differ in
their default metrics only; ``pool`` is the kind without a family.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path

import numpy as np

from medadapt.data.jsonl import field, iter_jsonl
from medadapt.errors import DataError
from medadapt.eval.metrics import evaluate_run, parse_metric
from medadapt.eval.retrieval import dense_run
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind
from medadapt.progress import encode_with_progress

__all__ = ["ENTITY_LINKING_METRICS", "QA_METRICS", "EntityLinkingTask", "PoolQuery", "PoolTask", "QaTask", "build_pool",
           "evaluate_pool", "load_pool_task"]

QA_METRICS = ("recall@5", "recall@20", "ndcg@20")
ENTITY_LINKING_METRICS = ("recall@1", "recall@5", "mrr@5")


@dataclass(frozen=True)
class PoolQuery:
    id: str
    query: str
    positives: tuple[str, ...]
    negatives: tuple[str, ...] = dc_field(default=())


def _texts(obj: dict, key: str, path: Path, lineno: int, required: bool) -> tuple[str, ...]:
    value = field(obj, key, list, path, lineno, required=required) or []
    if any(not isinstance(v, str) or not v.strip() for v in value):
        raise DataError(f"{path}:{lineno}: field {key!r} must be a list of non-empty strings")
    return tuple(value)


def load_pool_task(path: str | Path) -> list[PoolQuery]:
    """Read a QA / entity-linking JSONL file (see module docstring)."""
    path = Path(path)
    items, seen = [], set()
    for lineno, obj in iter_jsonl(path, "task file"):
        query = field(obj, "query", str, path, lineno)
        positives = _texts(obj, "positives", path, lineno, required=True)
        if not positives:
            raise DataError(f"{path}:{lineno}: 'positives' must hold at least one passage")
        qid = str(field(obj, "id", (str, int), path, lineno, required=False) or lineno)
        if qid in seen:
            raise DataError(f"{path}:{lineno}: duplicate query id {qid!r}")
        seen.add(qid)
        items.append(PoolQuery(qid, query, positives, _texts(obj, "negatives", path, lineno, required=False)))
    if not items:
        raise DataError(f"{path}: no queries")
    return items


def build_pool(items: Iterable[PoolQuery]) -> tuple[list[str], dict[str, dict[str, int]]]:
    """``(pool texts, qrels)``: the deduplicated passage pool (first-seen order) and
    ``{qid: {pool_idx: 1}}``."""
    index: dict[str, int] = {}
    qrels: dict[str, dict[str, int]] = {}
    for it in items:
        for text in (*it.positives, *it.negatives):
            index.setdefault(text, len(index))
        qrels[it.id] = {str(index[p]): 1 for p in it.positives}
    return list(index), qrels


def evaluate_pool(model, items: list[PoolQuery], metrics: Iterable[str] = QA_METRICS, batch_size: int = 64,
                  show_progress: bool = False) -> dict[str, float]:
    """Rank the pool for every query and score the ranking (``{"recall@5": ..., ...}``)."""
    metrics = list(metrics)
    depth = max(parse_metric(m)[1] for m in metrics)
    pool, qrels = build_pool(items)
    q = encode_with_progress(model.encode_query, [it.query for it in items], batch_size=batch_size,
                             show_progress=show_progress, convert_to_numpy=True, desc="encoding queries")
    d = encode_with_progress(model.encode_document, pool, batch_size=batch_size, show_progress=show_progress,
                             convert_to_numpy=True, desc="encoding pool")
    run = dense_run([it.id for it in items], np.asarray(q), [str(i) for i in range(len(pool))], np.asarray(d),
                    max(depth, 100), getattr(model, "similarity_fn_name", "cosine"))
    return evaluate_run(qrels, run, metrics)


@register_task_kind
class PoolTask(EvalTask):
    kind = "pool"
    default_metrics = QA_METRICS

    def read(self, path: Path):
        return load_pool_task(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        metrics = evaluate_pool(model, self.data, settings.metrics, settings.batch_size, settings.show_progress)
        return {self.metadata.query_languages[0]: metrics}


@register_task_kind
class QaTask(PoolTask):
    kind = "qa"
    default_metrics = QA_METRICS


@register_task_kind
class EntityLinkingTask(PoolTask):
    kind = "entity-linking"
    default_metrics = ENTITY_LINKING_METRICS
