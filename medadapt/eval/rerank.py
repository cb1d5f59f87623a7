"""Rerank evaluation (CMedTEB): order each query's candidates by embedding similarity, then MAP@10,
nDCG@10 and MRR@10 from the candidates' grades (pytrec_eval)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from medadapt.data.rerank import RerankItem
from medadapt.eval.metrics import evaluate_run
from medadapt.eval.search import prepare_for_similarity
from medadapt.progress import encode_with_progress

RERANK_METRICS = ("map@10", "ndcg@10", "mrr@10")


def evaluate_rerank(model, items: list[RerankItem], metrics: Iterable[str] = RERANK_METRICS, batch_size: int = 64,
                    show_progress: bool = False) -> dict[str, float]:
    sim = getattr(model, "similarity_fn_name", "cosine")
    q = encode_with_progress(model.encode_query, [it.query for it in items], batch_size=batch_size,
                             show_progress=show_progress, desc="encoding queries")
    flat = [t for it in items for t in it.texts]
    d = encode_with_progress(model.encode_document, flat, batch_size=batch_size, show_progress=show_progress,
                             desc="encoding candidates")
    q, d = prepare_for_similarity(np.asarray(q), sim), prepare_for_similarity(np.asarray(d), sim)
    run, qrels, offset = {}, {}, 0
    for i, it in enumerate(items):
        qid = f"q{i}"
        scores = d[offset : offset + len(it.texts)] @ q[i]
        run[qid] = {f"c{j}": float(s) for j, s in enumerate(scores)}
        qrels[qid] = {f"c{j}": g for j, g in enumerate(it.grades)}
        offset += len(it.texts)
    return evaluate_run(qrels, run, metrics)
