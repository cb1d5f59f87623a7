"""MTEB's reranking layout, read into medadapt's :class:`~medadapt.data.rerank.RerankItem`.

The C-MTEB reranking sets (``C-MTEB/CMedQAv1-reranking``, ``C-MTEB/CMedQAv2-reranking``) and MTEB's
reranking tasks publish one row per query::

    {"query": "...", "positive": ["relevant text", ...], "negative": ["irrelevant text", ...]}

(``datasets.load_dataset(...)["test"].to_json("test.jsonl")`` writes exactly this). Positives get grade 1
and negatives grade 0, so :func:`medadapt.eval.evaluate_rerank` computes MAP@10 over each query's own
candidates as the CMedTEB paper does. medadapt's own rerank format (``{"query", "candidates"}``,
:mod:`medadapt.data.rerank`) is a different layout and is refused here with a message saying so.

Written by hand because neither ``mteb`` (which reads these rows from the Hugging Face hub inside its task
classes) nor ``datasets`` offers a loader of a local file into ranked lists with file/line errors.
"""

from __future__ import annotations

from pathlib import Path

from medadapt.data.jsonl import iter_jsonl
from medadapt.data.rerank import RerankItem
from medadapt.errors import DataError

__all__ = ["load_mteb_rerank"]


def load_mteb_rerank(path: str | Path) -> list[RerankItem]:
    """Read a JSONL file in MTEB's reranking layout (see module docstring).

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
