"""The pure core of hard-negative mining: pick negatives from one query's ranked candidates.

Rank-window sampling as in the three papers medadapt reproduces:

* HyReC (Appendix B, "ANN-style hard negative mining"): non-positive passages ranked 20th–100th by the
  first-stage model -> ``window=(20, 100)``; 3 negatives per query in its high-quality fine-tuning stage.
* Med-MoE-Embed (§IV-A, MCQA-Retri): BM25 ranks 6th–10th -> ``window=(6, 10)``, 5 negatives.
* BMRetriever (§3.3, "Hard Negative Mining and Data Filter"): 1 random passage from the top 100 of E5
  -> ``window=(1, 100)``, 1 negative.

**Ranks** are 1-based positions in the retriever's list *including* positives (a positive at rank 3 still
occupies rank 3); positives themselves are never sampled.

**False-negative guards** (CMedTEB §4.1 / Appendix B: with topic intensity, top-ranked "negatives" are
often unlabeled positives):

* ``margin`` (relative): drop candidates with ``score > pos_score - margin * |pos_score|``. For a
  non-negative positive score this is ``pos_score * (1 - margin)`` (the relative margin of
  sentence-transformers' ``mine_hard_negatives``); the ``|·|`` keeps the cut-off at or below the
  positive's score when scores are negative. ``margin=0`` drops candidates scoring above the positive.
* ``absolute_margin``: drop candidates with ``score > pos_score - absolute_margin``.
* ``excluded_ids``: ids known to be duplicates of a positive (e.g. by text, see
  :mod:`medadapt.curation.textsim`).

Hand-written: no library exposes rank-window sampling with these guards as a pure function.
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
    """Sample up to ``num`` negatives from ``candidates`` (``(doc_id, score)`` best first).

    Eligible: rank in ``window`` (inclusive, 1-based, positives counted), not a positive, not in
    ``excluded_ids``, and score within the margins (when ``pos_score`` is given). If at most ``num`` are
    eligible all are returned; otherwise ``num`` are drawn without replacement with ``rng``. The result is
    in rank order, so equal inputs and seeds give equal outputs.

    Raises:
        ValueError: a bad window or ``num``, or a margin requested without ``pos_score``.
    """
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
