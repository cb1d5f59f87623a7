"""Consistency filtering of synthetic pairs (BMRetriever §3.3, after Alberti et al. 2019): keep a
synthetic ``(query, passage)`` pair only when the retriever ranks the passage in its top ``k`` (default 3)
for the query over the whole corpus."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from medadapt.curation.search import Searcher, batched_search
from medadapt.data.training import TrainingGroup


def consistency_mask(
    query_texts: Sequence[str],
    positive_ids: Sequence[Sequence[str]],
    searcher: Searcher,
    top_k: int = 3,
    mode: Literal["all", "any"] = "all",
    *,
    batch_size: int = 256,
    show_progress: bool = True,
) -> list[bool]:
    """Per query, whether its positives (``mode`` ``all``, or ``any`` one) are in the searcher's top ``top_k``."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if mode not in ("all", "any"):
        raise ValueError(f"mode must be 'all' or 'any', got {mode!r}")
    if len(query_texts) != len(positive_ids):
        raise ValueError(f"{len(query_texts)} queries but {len(positive_ids)} positive lists")
    hits = batched_search(searcher, list(query_texts), top_k, batch_size, show_progress, desc="consistency")
    check = all if mode == "all" else any
    out = []
    for pos, row in zip(positive_ids, hits):
        top = {d for d, _ in row[:top_k]}
        out.append(bool(pos) and check(p in top for p in pos))
    return out


def filter_consistent_groups(
    groups: Sequence[TrainingGroup],
    searcher: Searcher,
    text_to_id: dict[str, str],
    top_k: int = 3,
    mode: Literal["all", "any"] = "all",
    *,
    batch_size: int = 256,
    show_progress: bool = True,
) -> list[TrainingGroup]:
    """The groups whose positives pass :func:`consistency_mask`; ``text_to_id`` maps every positive text to
    its id in the searcher's corpus."""
    missing = [p for g in groups for p in g.pos if p not in text_to_id]
    if missing:
        raise ValueError(f"{len(missing)} positive passage(s) are not in the search corpus, "
                         f"e.g. {missing[0][:60]!r}")
    mask = consistency_mask([g.query for g in groups], [[text_to_id[p] for p in g.pos] for g in groups],
                            searcher, top_k, mode, batch_size=batch_size, show_progress=show_progress)
    return [g for g, keep in zip(groups, mask) if keep]
