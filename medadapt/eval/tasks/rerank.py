"""Rerank tasks: each query's own candidates ordered by similarity; MAP@10, nDCG@10, MRR@10 from their grades.

Two file layouts: MTEB's reranking rows (``{"query", "positive", "negative"}``, ``layout="mteb"``, what the
suites read: :func:`load_mteb_rerank`) and medadapt's own
(``{"query", "candidates"}``, :func:`medadapt.data.load_rerank`, the default of ``medadapt eval --task rerank``).
"""

from __future__ import annotations

from pathlib import Path

from medadapt.data.jsonl import iter_jsonl
from medadapt.data.rerank import RerankItem, load_rerank
from medadapt.errors import DataError
from medadapt.eval.rerank import RERANK_METRICS, evaluate_rerank
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind


def load_mteb_rerank(path: str | Path) -> list[RerankItem]:
    """Read a JSONL file in MTEB's reranking layout (:mod:`medadapt.eval.suites.layouts` shows it).

    Raises:
        DataError: naming the file and line: a row in another layout (e.g. medadapt's ``candidates``), a
            missing or non-list ``positive`` / ``negative``, a non-string text, a row without any
            positive, or an empty file.
    """
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
