"""IR metrics over a run, computed with pytrec_eval (trec_eval's C code; not re-implemented here).

Metric names are ``<name>@<k>``. The default (trec_eval) definitions, each a mean over queries of a
per-query value: ``ndcg``, ``recall``, ``mrr``, ``map``, ``precision``, ``f1`` and ``accuracy`` (share of
queries with a relevant document in the top k, trec_eval's ``success``). ``f1@k`` is the per-query harmonic
mean of ``precision@k`` and ``recall@k``, averaged over queries.

Med-MoE-Embed's tables need other definitions (worked out from its published rows; docs/evaluation.md and
``tests/test_eval_metrics.py``), named apart so they are never mistaken for the trec ones:

* ``paper_f1@k``: the harmonic mean of the *averaged* ``precision@k`` and ``recall@k`` (every row of the
  paper's Tables I-III, V, VI: F1 = 2PR/(P+R) of its own P and R).
* ``paper_map@k``: average precision over the top k normalised by the number of relevant documents *retrieved*
  there (not by all relevant ones), averaged over the queries with at least one relevant document in the top
  k (a query with none has no such AP). It can exceed ``recall@k``, as in the paper; trec ``map@k`` cannot.
* ``paper_accuracy@k``: binary classification accuracy over each query's *judged* documents (its qrels rows,
  relevant or judged non-relevant with grade <= 0): a document in the top k is predicted relevant, one outside
  it not; (relevant in the top k + judged non-relevant outside it) / judged, averaged over queries. Retrieved
  documents without a judgement are in neither class. It can be below ``precision@k``, as in the paper;
  success@k cannot. With qrels that judge no non-relevant document it equals ``recall@k``.

Graded qrels feed nDCG with trec_eval's linear gain (gain = grade); binary measures count grade >= 1 as
relevant.

Negative grades (TREC's -2 for junk) are given to pytrec_eval as 0: trec_eval treats every grade <= 0 as
non-relevant, so no metric changes, but grades <= -2 collide with trec_eval's internal markers and can crash
the process (a segfault). Grades above :data:`MAX_GRADE` are refused: trec_eval allocates memory per
grade level and silently scores 0 (or crashes) on huge ones.
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

    ``per_query=True`` refuses the paper metrics, which are not means of per-query values (for paired
    comparisons)."""
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
    metrics as the module docstring defines them.

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
    for b, k in parsed:
        if b in ("f1", "paper_f1"):
            needed |= {f"P.{k}", f"recall.{k}"}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, needed).evaluate(run) if needed else {}
    paper: dict[int, tuple[float, float]] = {}  # k -> (paper_map, paper_accuracy)
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
        elif base == "paper_f1":
            p = sum(v[f"P_{k}"] for v in per_query.values()) / n
            r = sum(v[f"recall_{k}"] for v in per_query.values()) / n
            out[name] = f1_of_means(p, r)
        elif base in ("paper_map", "paper_accuracy"):
            if k not in paper:
                paper[k] = _paper_map_accuracy(qrels, run, k)
            out[name] = paper[k][0 if base == "paper_map" else 1]
        else:
            key = f"{_TREC[base]}_{k}"
            out[name] = sum(v[key] for v in per_query.values()) / n
    return out
