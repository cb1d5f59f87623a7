"""IR metrics over a run, computed with pytrec_eval (trec_eval's C code; not re-implemented here).

Metric names are ``<name>@<k>``: ``ndcg``, ``recall``, ``mrr``, ``map``, ``precision``, ``f1`` and
``accuracy`` (the Med-MoE-Embed paper's "Accuracy": share of queries with a relevant document in the top
k, trec_eval's ``success``). ``f1@k`` is the per-query harmonic mean of ``precision@k`` and ``recall@k``,
averaged over queries. Graded qrels feed nDCG with trec_eval's linear gain (gain = grade); binary measures count grade >= 1 as relevant.

Negative grades (TREC's -2 for junk) are given to pytrec_eval as 0: trec_eval treats every grade <= 0 as
non-relevant, so no metric changes, but grades <= -2 collide with trec_eval's internal markers and can crash
the process (a segfault). Grades above :data:`MAX_GRADE` are refused: trec_eval allocates memory per
grade level and silently scores 0 (or crashes) on huge ones.
"""

from __future__ import annotations

from collections.abc import Iterable

from medadapt.data.jsonl import MAX_GRADE  # data flows into eval, never back

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

#: metric name -> pytrec_eval measure prefix
_TREC = {"ndcg": "ndcg_cut", "recall": "recall", "map": "map_cut", "precision": "P", "accuracy": "success"}
ALL_METRICS = ("ndcg", "recall", "mrr", "map", "precision", "f1", "accuracy")
DEFAULT_METRICS = ("ndcg@10", "recall@100", "mrr@10", "map@10", "recall@10", "ndcg@100")
#: largest K in ``NAME@K`` (pytrec_eval misreads cutoffs that overflow a C long)
MAX_K = 1_000_000


def parse_metric(name: str) -> tuple[str, int]:
    try:
        base, k = name.lower().split("@")
        k = int(k)
    except ValueError:
        raise ValueError(f"metric {name!r} is not of the form NAME@K, e.g. ndcg@10") from None
    if base not in ALL_METRICS or k < 1:
        raise ValueError(f"unknown metric {name!r}; choose from {', '.join(ALL_METRICS)} with @K, K >= 1")
    if k > MAX_K:
        raise ValueError(f"metric {name!r}: K must be at most {MAX_K:,}")
    return base, k


def truncate_run(run: Run, k: int) -> Run:
    out = {}
    for qid, docs in run.items():
        top = sorted(docs.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        out[qid] = dict(top)
    return out


def _safe_qrels(qrels: Qrels) -> Qrels:
    """``qrels`` with integer grades, negative ones clamped to 0, for pytrec_eval."""
    from medadapt.errors import DataError

    out: Qrels = {}
    for qid, docs in qrels.items():
        row = out[qid] = {}
        for did, grade in docs.items():
            g = int(grade)
            if g > MAX_GRADE:
                raise DataError(f"qrels grade {g} (query {qid!r}, document {did!r}) is above {MAX_GRADE}")
            row[did] = max(g, 0)
    return out


def evaluate_run(qrels: Qrels, run: Run, metrics: Iterable[str] = DEFAULT_METRICS) -> dict[str, float]:
    """Mean of each metric over the queries in ``qrels`` (a query missing from ``run`` scores 0).

    Negative grades are passed to pytrec_eval as 0 (the same metrics: trec_eval counts grades <= 0 as
    non-relevant; grades <= -2 could otherwise crash it). A grade above :data:`MAX_GRADE` raises
    :class:`~medadapt.errors.DataError`.
    """
    import pytrec_eval

    qrels = _safe_qrels(qrels)
    metrics = list(dict.fromkeys(m.lower() for m in metrics))
    parsed = [parse_metric(m) for m in metrics]
    run = {q: {d: float(s) for d, s in run.get(q, {}).items()} for q in qrels}
    # trec_eval drops queries with an empty ranking; give them one impossible document so they count as 0.
    for q, docs in run.items():
        if not docs:
            docs["__medadapt_none__"] = 0.0
    n = len(qrels)
    if n == 0:
        raise ValueError("qrels are empty")
    needed = {f"{_TREC[b]}.{k}" for b, k in parsed if b in _TREC}
    needed |= {f"P.{k}" for b, k in parsed if b == "f1"} | {f"recall.{k}" for b, k in parsed if b == "f1"}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, needed).evaluate(run) if needed else {}
    out: dict[str, float] = {}
    for name, (base, k) in zip(metrics, parsed):
        if base == "mrr":
            rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(truncate_run(run, k))
            out[name] = sum(v["recip_rank"] for v in rr.values()) / n
        elif base == "f1":
            total = 0.0
            for v in per_query.values():
                p, r = v[f"P_{k}"], v[f"recall_{k}"]
                total += 2 * p * r / (p + r) if p + r > 0 else 0.0
            out[name] = total / n
        else:
            key = f"{_TREC[base]}_{k}"
            out[name] = sum(v[key] for v in per_query.values()) / n
    return out
