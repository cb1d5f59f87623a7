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

from medadapt.eval.tasks.rerank import load_mteb_rerank

__all__ = ["load_mteb_rerank"]
