"""Fleiss' kappa (Fleiss 1971), as statsmodels computes it (not a dependency): ``nan`` when every rating
falls into one category (chance agreement 1).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np


def category_counts(
    ratings: Sequence[Sequence[Hashable]], categories: Sequence[Hashable] | None = None
) -> np.ndarray:
    """``N × C`` count table from per-item rating lists (each item rated by the same number of raters)."""
    if not ratings:
        raise ValueError("no items to compute agreement on")
    n = len(ratings[0])
    if any(len(r) != n for r in ratings):
        raise ValueError("every item must have the same number of ratings")
    cats = list(categories) if categories is not None else sorted({c for r in ratings for c in r}, key=str)
    pos = {c: j for j, c in enumerate(cats)}
    table = np.zeros((len(ratings), len(cats)), dtype=np.int64)
    for i, row in enumerate(ratings):
        for c, cnt in Counter(row).items():
            if c not in pos:
                raise ValueError(f"rating {c!r} is not one of the categories {cats}")
            table[i, pos[c]] = cnt
    return table


def fleiss_kappa(table: np.ndarray | Sequence[Sequence[Hashable]]) -> float:
    """Fleiss' kappa from an ``N × C`` count table, or from per-item rating lists."""
    arr = np.asarray(table) if isinstance(table, np.ndarray) else None
    if arr is None or arr.dtype.kind not in "iuf":
        arr = category_counts(table)  # type: ignore[arg-type]
    arr = arr.astype(np.float64)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError("need a non-empty items × categories table")
    n = arr.sum(axis=1)
    if not np.allclose(n, n[0]) or n[0] < 2:
        raise ValueError("every item needs the same number (>= 2) of ratings")
    n_raters, n_items = n[0], arr.shape[0]
    p_i = ((arr**2).sum(axis=1) - n_raters) / (n_raters * (n_raters - 1))
    p_bar = p_i.mean()
    p_j = arr.sum(axis=0) / (n_items * n_raters)
    p_e = float((p_j**2).sum())
    if np.isclose(p_e, 1.0):
        return float("nan")
    return float((p_bar - p_e) / (1 - p_e))
