"""Score fusion as small pure functions over ``{doc_id: score}`` lists, and the one hybrid score
``lexical + dense_weight * dense`` (HyReC eq. 9, :func:`hybrid_score`). A document missing from a list gets
that list's lowest normalised score (nothing in RRF); ties break by document id. See docs/retrieval.md."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

import numpy as np

Scores = Mapping[str, float]
T = TypeVar("T")


# ---------------------------------------------------------------------------------------- hybrid score
def hybrid_score(lexical: T, dense: T, dense_weight: float = 1.0) -> T:
    """``lexical + dense_weight * dense`` (HyReC eq. 9) for floats, numpy arrays or torch tensors."""
    return lexical + dense_weight * dense


def hybrid_weights(dense_weight: float) -> list[float]:
    """List weights ``[dense, lexical]`` for :func:`fuse` with :func:`hybrid_score`'s meaning (lexical 1)."""
    if not dense_weight >= 0 or not math.isfinite(dense_weight):
        raise ValueError(f"dense_weight must be a finite number >= 0, got {dense_weight}")
    return [float(dense_weight), 1.0]


def hybrid_topk(positions: np.ndarray, lexical: np.ndarray, dense: np.ndarray, dense_weight: float = 1.0,
                k: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(positions, scores)`` of the best ``k`` (all when ``None``) distinct candidate positions by their exact
    :func:`hybrid_score` of true ``lexical`` and ``dense`` scores, best first; ties go to the lower position."""
    positions = np.asarray(positions)
    score = hybrid_score(np.asarray(lexical), np.asarray(dense), dense_weight)
    order = np.lexsort((positions, -score))[:k]
    return positions[order], score[order]



def minmax_normalize(scores: Scores) -> dict[str, float]:
    """Map scores linearly onto [0, 1]; a list whose scores are all equal maps to 1.0."""
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    if hi - lo <= 0:
        return {d: 1.0 for d in scores}
    return {d: (s - lo) / (hi - lo) for d, s in scores.items()}


def zscore_normalize(scores: Scores) -> dict[str, float]:
    """Subtract the mean and divide by the (population) standard deviation; constant lists map to 0."""
    if not scores:
        return {}
    values = list(scores.values())
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if std <= 0:
        return {d: 0.0 for d in scores}
    return {d: (s - mean) / std for d, s in scores.items()}


def _weights(n: int, weights: Sequence[float] | None) -> list[float]:
    if weights is None:
        return [1.0 / n] * n
    if len(weights) != n:
        raise ValueError(f"got {len(weights)} weights for {n} lists")
    if any(w < 0 for w in weights):
        raise ValueError("fusion weights must be non-negative")
    return [float(w) for w in weights]


def _ranked(fused: dict[str, float], k: int | None) -> dict[str, float]:
    items = sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))
    return dict(items[:k] if k is not None else items)


def weighted_sum(normalized: Sequence[Mapping[str, float]], weights: Sequence[float] | None = None,
                 k: int | None = None, floors: Sequence[float] | None = None) -> dict[str, float]:
    """Weighted sum of normalised lists; a document missing from list ``i`` gets ``floors[i]`` (default: that
    list's lowest score)."""
    ws = _weights(len(normalized), weights)
    if floors is None:
        floors = [min(n.values()) if n else 0.0 for n in normalized]
    docs: dict[str, None] = {}
    for n in normalized:
        docs.update(dict.fromkeys(n))
    fused = {
        d: sum(w * n.get(d, floor) for w, n, floor in zip(ws, normalized, floors) if n) for d in docs
    }
    return _ranked(fused, k)


def minmax_fusion(lists: Sequence[Scores], weights: Sequence[float] | None = None,
                  k: int | None = None) -> dict[str, float]:
    """Min-max normalise each list, then weighted sum (missing documents count as that list's 0, also when
    the list is constant, e.g. a single retrieved document: it then scores 1 and the missing ones 0).

    Example::

        >>> minmax_fusion([{"a": 3, "b": 1}, {"b": 10, "c": 5}], weights=[0.5, 0.5])
        {'a': 0.5, 'b': 0.5, 'c': 0.0}
        >>> minmax_fusion([{"a": 2.9}, {"a": 0.1, "b": 0.3}], weights=[0.7, 0.3])
        {'a': 0.7, 'b': 0.3}
    """
    return weighted_sum([minmax_normalize(s) for s in lists], weights, k, floors=[0.0] * len(lists))


def zscore_fusion(lists: Sequence[Scores], weights: Sequence[float] | None = None,
                  k: int | None = None) -> dict[str, float]:
    """Z-score each list, then weighted sum (missing documents get that list's minimum z-score)."""
    return weighted_sum([zscore_normalize(s) for s in lists], weights, k)


def rrf_fusion(lists: Sequence[Scores], k_rrf: int = 60, weights: Sequence[float] | None = None,
               k: int | None = None) -> dict[str, float]:
    """Reciprocal rank fusion (Cormack et al. 2009): ``sum_i w_i / (k_rrf + rank_i(d))``, ranks from 1 (ties by
    document id), weight 1 per list by default."""
    ws = [1.0] * len(lists) if weights is None else _weights(len(lists), weights)
    fused: dict[str, float] = {}
    for w, scores in zip(ws, lists):
        for rank, (d, _) in enumerate(sorted(scores.items(), key=lambda kv: (-kv[1], kv[0])), start=1):
            fused[d] = fused.get(d, 0.0) + w / (k_rrf + rank)
    return _ranked(fused, k)


def sum_fusion(lists: Sequence[Scores], weights: Sequence[float] | None = None, k: int | None = None
               ) -> dict[str, float]:
    """Weighted sum of raw scores on one scale (HyReC's eq. 9 with :func:`hybrid_weights`). A missing document
    gets that list's lowest score, the tightest known bound (0 would sink it when all cosines are high)."""
    return weighted_sum([dict(s) for s in lists], weights, k)


FUSERS = {"minmax": minmax_fusion, "zscore": zscore_fusion, "sum": sum_fusion}


def fuse(lists: Sequence[Scores], method: str = "minmax", weights: Sequence[float] | None = None,
         k: int | None = None, rrf_k: int = 60) -> dict[str, float]:
    """Dispatch on ``method`` (``"minmax"``, ``"zscore"``, ``"rrf"`` or ``"sum"``)."""
    if method == "rrf":
        return rrf_fusion(lists, rrf_k, weights, k)
    if method not in FUSERS:
        raise ValueError(f"unknown fusion method {method!r}; choose one of: minmax, zscore, rrf, sum")
    return FUSERS[method](lists, weights, k)


def fuse_positions(dense: Mapping[int, float], lexical: Mapping[int, float], fusion, k: int
                   ) -> list[tuple[int, float]]:
    """:func:`fuse` of a dense and a lexical list keyed by document position, with ``fusion``'s method, weights
    (:func:`hybrid_weights`) and RRF constant (a :class:`~medadapt.retrieval.config.FusionConfig`); ties go
    to the lower position (zero-padded keys make the id tie-break the position order)."""
    keyed = [{f"{p:012d}": s for p, s in side.items()} for side in (dense, lexical)]
    fused = fuse(keyed, fusion.method, hybrid_weights(fusion.dense_weight), k, fusion.rrf_k)
    return [(int(key), score) for key, score in fused.items()]


def fuse_runs(runs: Sequence[Mapping[str, Scores]], method: str = "minmax",
              weights: Sequence[float] | None = None, k: int | None = None, rrf_k: int = 60
              ) -> dict[str, dict[str, float]]:
    """Fuse whole runs ``{qid: {doc_id: score}}`` query by query (a missing query is an empty list)."""
    qids: dict[str, None] = {}
    for run in runs:
        qids.update(dict.fromkeys(run))
    return {q: fuse([run.get(q, {}) for run in runs], method, weights, k, rrf_k) for q in qids}
