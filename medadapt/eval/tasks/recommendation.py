"""Paper recommendation (BMRetriever §4, RELISH): rank each query article's own candidates; MAP and nDCG.

RELISH gives every query article a list of candidate articles graded 0 (not similar), 1 (somewhat) and 2
(similar); the model ranks the candidates of each query by similarity. File format, JSONL, one query per
line::

    {"query": "Title and abstract of the query article ...",
     "candidates": [{"text": "candidate article ...", "grade": 2}, {"text": "...", "grade": 0}],
     "id": "p1"}                                   # "id" optional (default: line number)

Metrics over the full candidate lists (pytrec_eval): ``map`` (grade >= 1 relevant) and ``ndcg`` (gain =
grade); a query with no relevant candidate is skipped (trec_eval's convention) and counted in ``skipped``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from medadapt.data.jsonl import field, iter_jsonl
from medadapt.errors import DataError
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind
from medadapt.eval.tasks.rerank import candidate_scores

__all__ = ["RECOMMENDATION_METRICS", "Candidate", "RecommendationQuery", "RecommendationTask",
           "evaluate_recommendation", "load_recommendation", "score_run"]

RECOMMENDATION_METRICS = ("map", "ndcg")


@dataclass(frozen=True)
class Candidate:
    text: str
    grade: int


@dataclass(frozen=True)
class RecommendationQuery:
    id: str
    query: str
    candidates: tuple[Candidate, ...]


def load_recommendation(path: str | Path) -> list[RecommendationQuery]:
    """Read a paper-recommendation JSONL file (see module docstring)."""
    path = Path(path)
    items, seen = [], set()
    for lineno, obj in iter_jsonl(path, "task file"):
        query = field(obj, "query", str, path, lineno)
        raw = field(obj, "candidates", list, path, lineno)
        cands = []
        for c in raw:
            if not isinstance(c, dict) or not isinstance(c.get("text"), str) or \
                    isinstance(c.get("grade"), bool) or not isinstance(c.get("grade"), int) or c["grade"] < 0:
                raise DataError(f"{path}:{lineno}: each candidate must be "
                                f"{{\"text\": str, \"grade\": int >= 0}}")
            cands.append(Candidate(c["text"], c["grade"]))
        if len(cands) < 2:
            raise DataError(f"{path}:{lineno}: a query needs at least 2 candidates to rank")
        qid = str(field(obj, "id", (str, int), path, lineno, required=False) or lineno)
        if qid in seen:
            raise DataError(f"{path}:{lineno}: duplicate query id {qid!r}")
        seen.add(qid)
        items.append(RecommendationQuery(qid, query, tuple(cands)))
    if not items:
        raise DataError(f"{path}: no queries")
    return items


def score_run(qrels: dict[str, dict[str, int]], run: dict[str, dict[str, float]]) -> dict[str, float]:
    """Mean full-list ``map`` and ``ndcg`` over the queries with a relevant candidate, plus ``skipped``."""
    import pytrec_eval

    judged = {q: r for q, r in qrels.items() if any(g >= 1 for g in r.values())}
    if not judged:
        raise DataError("no query has a relevant candidate (grade >= 1); MAP / nDCG are undefined")
    per_query = pytrec_eval.RelevanceEvaluator(judged, {"map", "ndcg"}).evaluate(
        {q: run[q] for q in judged})
    n = len(judged)
    return {"map": sum(v["map"] for v in per_query.values()) / n,
            "ndcg": sum(v["ndcg"] for v in per_query.values()) / n,
            "skipped": float(len(qrels) - n)}


def evaluate_recommendation(model, items: list[RecommendationQuery], batch_size: int = 64,
                            show_progress: bool = False) -> dict[str, float]:
    """Rank each query's candidates with ``model`` and return ``{"map", "ndcg", "skipped"}``."""
    scores = candidate_scores(model, [it.query for it in items], [[c.text for c in it.candidates] for it in items],
                              batch_size, show_progress)
    run = {it.id: {str(j): float(s) for j, s in enumerate(row)} for it, row in zip(items, scores)}
    qrels = {it.id: {str(j): c.grade for j, c in enumerate(it.candidates)} for it in items}
    return score_run(qrels, run)


@register_task_kind
class RecommendationTask(EvalTask):
    kind = "recommendation"
    default_metrics = RECOMMENDATION_METRICS
    fixed_metrics = "map and ndcg"

    def read(self, path: Path):
        return load_recommendation(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        metrics = evaluate_recommendation(model, self.data, settings.batch_size, settings.show_progress)
        return {self.metadata.query_languages[0]: metrics}
