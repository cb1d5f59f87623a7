"""Dense retrieval evaluation: encode queries with ``encode_query`` and documents with
``encode_document`` (so asymmetric models evaluate correctly), exact search, pytrec_eval metrics."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from medadapt.cache import EmbeddingCache
from medadapt.data.beir import BeirDataset
from medadapt.eval.metrics import DEFAULT_METRICS, Run, evaluate_run, parse_metric
from medadapt.eval.search import exact_search, prepare_for_similarity


def encode_split(model, data: BeirDataset, split: str, cache=None, batch_size: int = 64, show_progress: bool = True):
    """Return ``(query_ids, query_emb, doc_ids, doc_emb)`` for a split, through the cache when given."""
    cache = cache if cache is not None else EmbeddingCache()
    queries = data.split_queries(split)
    qids = list(queries)
    q = cache.encode(model, [queries[i] for i in qids], role="query", batch_size=batch_size,
                     show_progress=show_progress, desc="encoding queries")
    d = cache.encode(model, data.doc_texts(), role="document", batch_size=batch_size,
                     show_progress=show_progress, desc="encoding corpus")
    return qids, q, data.doc_ids, d


def dense_run(qids, q_emb, doc_ids, d_emb, k: int, similarity_fn_name: str | None = "cosine") -> Run:
    """Top-``k`` run dict ``{qid: {doc_id: score}}`` from embeddings."""
    q = prepare_for_similarity(np.asarray(q_emb, dtype=np.float32), similarity_fn_name)
    d = prepare_for_similarity(np.asarray(d_emb, dtype=np.float32), similarity_fn_name)
    scores, idx = exact_search(q, d, k)
    return {
        qid: {doc_ids[j]: float(s) for s, j in zip(scores[r], idx[r]) if j >= 0} for r, qid in enumerate(qids)
    }


def evaluate_retrieval(
    model,
    data: BeirDataset,
    split: str = "test",
    metrics: Iterable[str] = DEFAULT_METRICS,
    cache=None,
    batch_size: int = 64,
    show_progress: bool = True,
    return_run: bool = False,
):
    """Evaluate a SentenceTransformer on a BEIR split; returns ``{"ndcg@10": ..., ...}``
    (and the run when ``return_run``)."""
    metrics = list(metrics)
    depth = max([parse_metric(m)[1] for m in metrics] + [100])
    qids, q, doc_ids, d = encode_split(model, data, split, cache, batch_size, show_progress)
    run = dense_run(qids, q, doc_ids, d, depth, getattr(model, "similarity_fn_name", "cosine"))
    result = evaluate_run(data.qrels[split], run, metrics)
    return (result, run) if return_run else result
