"""The pure core of hard-negative mining: rank-window sampling from one query's candidates (HyReC 20-100,
Med-MoE-Embed 6-10, BMRetriever 1-100) with false-negative guards. Ranks are 1-based and count positives,
which are never sampled. See docs/curation.md.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from medadapt.curation.search import Hit


def margin_threshold(
    pos_score: float, margin: float | None = None, absolute_margin: float | None = None
) -> float:
    """The highest score a negative may have given the positive's score (``inf`` without margins)."""
    limit = float("inf")
    if margin is not None:
        limit = min(limit, pos_score - margin * abs(pos_score))
    if absolute_margin is not None:
        limit = min(limit, pos_score - absolute_margin)
    return limit


def validate_window(window: tuple[int, int]) -> tuple[int, int]:
    lo, hi = int(window[0]), int(window[1])
    if lo < 1 or hi < lo:
        raise ValueError(f"rank window must satisfy 1 <= lo <= hi, got ({lo}, {hi})")
    return lo, hi


def sample_negatives(
    candidates: Sequence[Hit],
    positive_ids: Collection[str],
    pos_score: float | None,
    window: tuple[int, int] = (20, 100),
    num: int = 1,
    rng: random.Random | int | None = None,
    margin: float | None = None,
    excluded_ids: Collection[str] = (),
    absolute_margin: float | None = None,
) -> list[Hit]:
    """Up to ``num`` negatives of ``candidates`` (``(doc_id, score)`` best first), in rank order: ranked in
    ``window``, not a positive or excluded, within the margins; drawn with ``rng`` when more are eligible."""
    lo, hi = validate_window(window)
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    if (margin is not None or absolute_margin is not None) and pos_score is None:
        raise ValueError("a margin needs the positive's score (pos_score)")
    if margin is not None and margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if not isinstance(rng, random.Random):
        rng = random.Random(rng)
    limit = margin_threshold(pos_score, margin, absolute_margin) if pos_score is not None else float("inf")
    positives, excluded = set(positive_ids), set(excluded_ids)
    eligible = [
        (rank, (doc_id, score))
        for rank, (doc_id, score) in enumerate(candidates[lo - 1 : hi], start=lo)
        if doc_id not in positives and doc_id not in excluded and score <= limit
    ]
    if len(eligible) > num:
        eligible = sorted(rng.sample(eligible, num))
    return [hit for _, hit in eligible]
