"""What the report computes with the models: per-query nDCG@10 of the frozen base and the trained model, the
similarity of queries to positives and hard negatives, and the expert load of routed heads (through the
:class:`RoutingStatsSource` protocol). Encoding goes through the embedding cache: after training it is free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from medadapt.adapters.api import adapter_names
from medadapt.errors import MedAdaptError
from medadapt.eval import dense_run
from medadapt.eval.metrics import per_query_values
from medadapt.eval.search import prepare_for_similarity
from medadapt.models import load

__all__ = ["QueryRow", "RetrievalAnalysis", "RoutingStatsSource", "analyse_retrieval", "per_query_ndcg"]

Log = Callable[[str], None]


@runtime_checkable
class RoutingStatsSource(Protocol):
    """A module that counts its routing decisions: ``routing_stats()`` returns at least ``names`` (routed
    experts) and ``running_load`` (share of decisions per expert since the last reset)."""

    def routing_stats(self) -> dict[str, Any]: ...

    def reset_routing_stats(self) -> None: ...


@dataclass(frozen=True)
class QueryRow:
    qid: str
    text: str
    base: float
    trained: float

    @property
    def delta(self) -> float:
        return self.trained - self.base


@dataclass
class RetrievalAnalysis:
    """Per-query scores (``base`` NaN without a frozen base) and, per model label, the mean ``metric`` and the
    ``(positive, hard-negative)`` similarities of one split; ``negatives_from`` names the model whose ranking
    chose the negatives; ``expert_load`` is ``{"names", "queries", "documents"}`` for a routed model."""

    data: str
    split: str
    metric: str = "ndcg@10"
    rows: list[QueryRow] = field(default_factory=list)
    means: dict[str, float] = field(default_factory=dict)
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    negatives_from: str = ""
    expert_load: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def per_query_ndcg(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]],
                   k: int = 10) -> dict[str, float]:
    """``nDCG@k`` of every query of ``qrels`` (:func:`medadapt.eval.metrics.per_query_values`: pytrec_eval, a
    query missing from ``run`` scores 0, negative grades count as 0)."""
    return per_query_values(qrels, run, f"ndcg@{k}")


def _routers(model) -> list[Any]:
    return [m for m in model.modules() if isinstance(m, RoutingStatsSource) and not isinstance(m, type)]


def _load_of(routers: list[Any]) -> tuple[list[str], list[float]] | None:
    """The summed running load of the routing modules (one head in practice)."""
    names: list[str] | None = None
    counts: np.ndarray | None = None
    for r in routers:
        stats = r.routing_stats()
        load, seen = stats.get("running_load"), stats.get("inputs_seen") or 0
        if not load or not seen:
            continue
        if names is None:
            names, counts = list(map(str, stats.get("names", []))), np.zeros(len(load))
        if len(load) == len(counts):
            counts = counts + np.asarray(load, dtype=float) * seen
    if names is None or counts is None or counts.sum() <= 0 or len(names) != len(counts):
        return None
    return names, (counts / counts.sum()).tolist()


def _encode(model, data, split, cache, batch_size, show_progress, depth, routers=()):
    """``(qids, query_emb, doc_emb, run, load)``: embeddings prepared for inner product, the top-``depth``
    dense run, and with ``routers`` the load on the queries and on the documents."""
    queries = data.split_queries(split)
    qids = list(queries)
    load, embs = {}, []
    for role, texts, key in (("query", [queries[i] for i in qids], "queries"),
                             ("document", data.doc_texts(), "documents")):
        for r in routers:
            r.reset_routing_stats()
        embs.append(cache.encode(model, texts, role=role, batch_size=batch_size, show_progress=show_progress,
                                 desc="encoding queries" if role == "query" else "encoding corpus"))
        if routers:
            load[key] = _load_of(routers)
    sim = getattr(model, "similarity_fn_name", "cosine")
    q, d = (prepare_for_similarity(e, sim) for e in embs)
    return qids, q, d, dense_run(qids, q, data.doc_ids, d, depth, "dot"), load


def _frozen_base(model, run, log: Log, notes: list[str]):
    """A context-free way to get the frozen base: ``("disable", model)`` when the model has medadapt heads,
    else ``("load", base)`` from the recipe's ``model.backbone``, else ``(None, None)`` with a note."""
    if adapter_names(model):
        return "disable", model
    section = run.recipe.get("model")
    backbone = section.get("backbone") if isinstance(section, dict) else None
    if not isinstance(backbone, str):
        notes.append("the recipe names no frozen base model (model.backbone): the frozen-base comparison "
                     "is left out.")
        return None, None
    try:
        log(f"loading the frozen base model {backbone}")
        return "load", load(backbone)
    except (MedAdaptError, OSError) as exc:
        notes.append(f"the frozen base model {backbone!r} could not be loaded ({exc}): the frozen-base "
                     "comparison is left out.")
        return None, None


def _scores(qids, q, d, doc_index, qrels, neg_ids) -> tuple[np.ndarray, np.ndarray]:
    pos, neg = [], []
    for r, qid in enumerate(qids):
        rel = [doc_index[x] for x, g in qrels.get(qid, {}).items() if g > 0 and x in doc_index]
        if rel:
            pos.extend((d[rel] @ q[r]).tolist())
        if neg_ids.get(qid):
            neg.extend((d[neg_ids[qid]] @ q[r]).tolist())
    return np.asarray(pos, dtype=np.float32), np.asarray(neg, dtype=np.float32)


def analyse_retrieval(model, run, data, split: str, data_name: str, cache, *, num_negatives: int = 5,
                      batch_size: int = 64, show_progress: bool = True,
                      log: Log = lambda _m: None) -> RetrievalAnalysis:
    """Per-query nDCG@10 of the frozen base (from ``run``'s recipe) and the trained ``model`` on ``data`` /
    ``split``; each query's similarity to its relevant documents and to its ``num_negatives`` hard negatives
    (chosen by the frozen base, else the trained model: the same pairs for both); the routed expert load."""
    inner = getattr(model, "st", model)  # a composed model's dense side
    out = RetrievalAnalysis(data=data_name, split=split)
    qrels = data.qrels[split]
    doc_ids = data.doc_ids
    doc_index = {x: i for i, x in enumerate(doc_ids)}
    depth = max(100, num_negatives + max((len(v) for v in qrels.values()), default=0))

    routers = _routers(inner)
    log(f"encoding {len(data.split_queries(split)):,} queries and {len(doc_ids):,} documents with the "
        "trained model")
    qids, q_t, d_t, run_t, load = _encode(inner, data, split, cache, batch_size, show_progress, depth, routers)
    if routers and load.get("queries") and load.get("documents"):
        out.expert_load = {"names": load["queries"][0], "queries": load["queries"][1],
                           "documents": load["documents"][1]}

    how, base_model = _frozen_base(inner, run, log, out.notes)
    run_b = q_b = d_b = None
    if how is not None:
        log("encoding with the frozen base model")
        if how == "disable":
            base_model.disable_adapters()
        try:
            _, q_b, d_b, run_b, _ = _encode(base_model, data, split, cache, batch_size, show_progress, depth)
        finally:
            if how == "disable":
                base_model.enable_adapters()

    log("scoring per query (pytrec_eval)")
    ndcg_t = per_query_ndcg(qrels, run_t)
    ndcg_b = per_query_ndcg(qrels, run_b) if run_b is not None else {}
    queries = data.split_queries(split)
    out.rows = [QueryRow(qid, queries.get(qid, ""), ndcg_b.get(qid, float("nan")), ndcg_t[qid])
                for qid in qrels]
    if ndcg_b:
        out.means["frozen base"] = float(np.mean(list(ndcg_b.values())))
    out.means["trained"] = float(np.mean(list(ndcg_t.values())))

    chooser, out.negatives_from = (run_b, "frozen base") if run_b is not None else (run_t, "trained model")
    neg_ids = {}
    for qid in qids:
        relevant = {x for x, g in qrels.get(qid, {}).items() if g > 0}
        ranked = sorted(chooser.get(qid, {}).items(), key=lambda kv: (-kv[1], kv[0]))
        neg_ids[qid] = [doc_index[x] for x, _ in ranked if x not in relevant][:num_negatives]
    if q_b is not None:
        out.scores["frozen base"] = _scores(qids, q_b, d_b, doc_index, qrels, neg_ids)
    out.scores["trained"] = _scores(qids, q_t, d_t, doc_index, qrels, neg_ids)
    if not any(len(p) and len(n) for p, n in out.scores.values()):
        out.notes.append("no query of this split has both a relevant document and a hard negative: the score "
                         "distribution is left out.")
        out.scores = {}
    return out
