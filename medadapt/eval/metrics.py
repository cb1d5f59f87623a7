"""IR metrics over a run, computed with pytrec_eval (trec_eval's C code; not re-implemented here).

Metric names are ``<name>@<k>``: ``ndcg``, ``recall``, ``mrr``, ``map``, ``precision``, ``f1`` (per-query
harmonic mean of P and R) and ``accuracy`` (trec_eval's ``success``), each a mean over queries. Med-MoE-Embed's
tables need other definitions, named apart (docs/evaluation.md, "Med-MoE-Embed's metrics"):

* ``paper_f1@k``: the harmonic mean of the *averaged* ``precision@k`` and ``recall@k``.
* ``paper_map@k``: AP over the top k normalised by the relevant documents *retrieved* there, averaged over the
  queries with at least one relevant document in the top k.
* ``paper_accuracy@k``: classification accuracy over each query's *judged* documents (top k predicted
  relevant), averaged over queries.

Graded qrels feed nDCG with linear gain; binary measures count grade >= 1 as relevant. Negative grades reach
pytrec_eval as 0 (same metrics; grades <= -2 can crash trec_eval); grades above :data:`MAX_GRADE` are refused.
"""

from __future__ import annotations

from collections.abc import Iterable

from medadapt.data.jsonl import MAX_GRADE  # data flows into eval, never back
from medadapt.errors import DataError

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

#: metric name -> pytrec_eval measure prefix
_TREC = {"ndcg": "ndcg_cut", "recall": "recall", "map": "map_cut", "precision": "P", "accuracy": "success"}
#: metrics that are a mean of per-query values (trec_eval's definitions; what ``--compare`` can pair)
PER_QUERY_METRICS = ("ndcg", "recall", "mrr", "map", "precision", "f1", "accuracy")
#: Med-MoE-Embed's paper-compatible definitions (see the module docstring)
PAPER_METRICS = ("paper_f1", "paper_map", "paper_accuracy")
ALL_METRICS = PER_QUERY_METRICS + PAPER_METRICS
DEFAULT_METRICS = ("ndcg@10", "recall@100", "mrr@10", "map@10", "recall@10", "ndcg@100")
#: largest K in ``NAME@K`` (pytrec_eval misreads cutoffs that overflow a C long)
MAX_K = 1_000_000


def parse_metric(name: str, *, per_query: bool = False) -> tuple[str, int]:
    """``"ndcg@10"`` -> ``("ndcg", 10)``; a ``ValueError`` naming the valid metrics otherwise.
    ``per_query=True`` also refuses the paper metrics, which are no means of per-query values."""
    try:
        base, k = name.lower().split("@")
        k = int(k)
    except ValueError:
        raise ValueError(f"metric {name!r} is not of the form NAME@K, e.g. ndcg@10") from None
    if base not in ALL_METRICS or k < 1:
        raise ValueError(f"unknown metric {name!r}; choose from {', '.join(ALL_METRICS)} with @K, K >= 1")
    if k > MAX_K:
        raise ValueError(f"metric {name!r}: K must be at most {MAX_K:,}")
    if per_query and base in PAPER_METRICS:
        raise ValueError(f"metric {name!r} is computed over all queries at once, not per query; use one of "
                         f"{', '.join(PER_QUERY_METRICS)} (e.g. {base.removeprefix('paper_')}@{k})")
    return base, k


def truncate_run(run: Run, k: int) -> Run:
    out = {}
    for qid, docs in run.items():
        top = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out[qid] = dict(top)
    return out


def trec_top_k(run: Run, k: int) -> Run:
    """Each query's first ``k`` documents in trec_eval's own order (score descending, ties by document id
    descending), so a set cut here is the one trec_eval's ``P@k`` counts."""
    return {q: dict(sorted(docs.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:k])
            for q, docs in run.items()}


def f1_of_means(precision: float, recall: float) -> float:
    """Med-MoE-Embed's F1: the harmonic mean of the averaged precision and recall (0 when both are 0)."""
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def _safe_qrels(qrels: Qrels) -> Qrels:
    """``qrels`` with integer grades, negative ones clamped to 0, for pytrec_eval."""
    out: Qrels = {}
    for qid, docs in qrels.items():
        row = out[qid] = {}
        for did, grade in docs.items():
            g = int(grade)
            if g > MAX_GRADE:
                raise DataError(f"qrels grade {g} (query {qid!r}, document {did!r}) is above {MAX_GRADE}")
            row[did] = max(g, 0)
    return out


def _full_run(qrels: Qrels, run: Run) -> Run:
    """``run`` over the queries of ``qrels``: trec_eval drops a query with an empty ranking, so such a query
    gets one impossible document and scores 0."""
    return {q: {d: float(s) for d, s in run.get(q, {}).items()} or {"__medadapt_none__": 0.0} for q in qrels}


def _per_query(qrels: Qrels, run: Run, parsed: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, float]]:
    """``{(base, k): {qid: value}}`` of the per-query metrics in ``parsed`` (``f1`` and ``paper_f1`` need
    ``precision`` and ``recall``, added), in trec_eval's query order; ``qrels`` and ``run`` as prepared."""
    import pytrec_eval

    needed = {(b, k) for b, k in parsed if b not in ("paper_map", "paper_accuracy")}
    needed |= {(m, k) for b, k in needed if b in ("f1", "paper_f1") for m in ("precision", "recall")}
    measures = {f"{_TREC[b]}.{k}" for b, k in needed if b in _TREC}
    found = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run) if measures else {}
    out = {(b, k): {q: v[f"{_TREC[b]}_{k}"] for q, v in found.items()} for b, k in needed if b in _TREC}
    for b, k in needed:
        if b == "mrr":
            rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(truncate_run(run, k))
            out[b, k] = {q: v["recip_rank"] for q, v in rr.items()}
        elif b == "f1":
            p, r = out["precision", k], out["recall", k]
            out[b, k] = {q: 2 * p[q] * r[q] / (p[q] + r[q]) if p[q] + r[q] > 0 else 0.0 for q in p}
    return out


def per_query_values(qrels: Qrels, run: Run, metric: str = "ndcg@10") -> dict[str, float]:
    """``{qid: value}`` of a per-query ``metric`` for every query of ``qrels`` (a query without results scores
    0): the values whose mean :func:`evaluate_run` reports."""
    parsed = parse_metric(metric, per_query=True)
    qrels = _safe_qrels(qrels)
    if not qrels:
        raise DataError("the qrels are empty")
    found = _per_query(qrels, _full_run(qrels, run), [parsed])[parsed]
    return {q: float(found.get(q, 0.0)) for q in qrels}


def _paper_map_accuracy(qrels: Qrels, run: Run, k: int) -> tuple[float, float]:
    """``(paper_map@k, paper_accuracy@k)`` from trec_eval's counts on the run cut at k (module docstring)."""
    import pytrec_eval

    measures = {"map", "num_rel", "num_rel_ret", "num_nonrel_judged_ret"}
    found = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(trec_top_k(run, k))
    aps, accuracy = [], 0.0
    for q, judged in qrels.items():
        v = found.get(q, {})
        hits, n_rel = int(round(v.get("num_rel_ret", 0.0))), int(round(v.get("num_rel", 0.0)))
        if hits:  # trec map = sum of precision at each relevant retrieved rank / all relevant
            aps.append(v.get("map", 0.0) * n_rel / hits)
        n_nonrel = len(judged) - sum(1 for g in judged.values() if g >= 1)
        correct = hits + n_nonrel - int(round(v.get("num_nonrel_judged_ret", 0.0)))
        accuracy += correct / len(judged) if judged else 0.0
    return (sum(aps) / len(aps) if aps else 0.0), accuracy / len(qrels)


def evaluate_run(qrels: Qrels, run: Run, metrics: Iterable[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric over the queries in ``qrels`` (a query missing from ``run`` scores 0); the paper
    metrics as the module docstring defines them. A grade above :data:`MAX_GRADE` is a :class:`DataError`."""
    qrels = _safe_qrels(qrels)
    metrics = list(dict.fromkeys(m.lower() for m in metrics))
    parsed = [parse_metric(m) for m in metrics]
    run = _full_run(qrels, run)
    n = len(qrels)
    if n == 0:
        raise ValueError("qrels are empty")
    per_query = _per_query(qrels, run, parsed)
    paper: dict[int, tuple[float, float]] = {}  # k -> (paper_map, paper_accuracy)
    out: dict[str, float] = {}
    for name, (base, k) in zip(metrics, parsed):
        if base == "paper_f1":
            out[name] = f1_of_means(*(sum(per_query[m, k].values()) / n for m in ("precision", "recall")))
        elif base in ("paper_map", "paper_accuracy"):
            if k not in paper:
                paper[k] = _paper_map_accuracy(qrels, run, k)
            out[name] = paper[k][0 if base == "paper_map" else 1]
        else:
            out[name] = sum(per_query[base, k].values()) / n
    return out
