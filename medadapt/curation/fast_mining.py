"""Hard-negative mining from precomputed embeddings (medadapt's one embedding miner): one exact search, then
:func:`~medadapt.curation.negatives.sample_negatives`' rules vectorised, the near-duplicate guard on
embeddings. Seeded per query, so chunking does not change the output. See docs/curation.md, "Fast path".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from medadapt.curation.mining_config import MiningConfig
from medadapt.curation.negatives import margin_threshold
from medadapt.retrieval.exact import exact_search, normalize_rows


def as_matrix(x, name: str) -> np.ndarray:
    """``x`` as a contiguous float32 matrix, refusing other shapes and non-finite values."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return x


def mine_from_embeddings(
    query_emb: np.ndarray,
    doc_emb: np.ndarray,
    positives: Sequence[set[int]],
    config: MiningConfig | None = None,
    *,
    normalize: bool = True,
    return_scores: bool = False,
    query_chunk: int = 4096,
    count_positives: bool = True,
    pick: Literal["random", "best"] = "random",
) -> list[list[int]] | tuple[list[list[int]], list[list[float]]]:
    """Per query, hard-negative document indices in rank order (with ``return_scores``, also their scores).

    Args:
        positives: per query, its positive document indices (empty: nothing excluded, no margin).
        normalize: L2-normalise both sides (cosine); ``False`` for dot-product models.
        count_positives: ranks count the positives (the papers' convention); ``False``: only non-positive
            documents, so ``window=(s + 1, s + n)`` skips the ``s`` best non-relevant ones (CARE stage II).
        pick: ``"random"`` (seeded per query) or ``"best"`` of the eligible candidates.
    """
    if pick not in ("random", "best"):
        raise ValueError(f"pick must be 'random' or 'best', got {pick!r}")
    config = config or MiningConfig()
    q = as_matrix(query_emb, "query_emb")
    d = as_matrix(doc_emb, "doc_emb")
    if q.shape[1] != d.shape[1]:
        raise ValueError(f"dimension mismatch: queries {q.shape}, documents {d.shape}")
    if len(positives) != len(q):
        raise ValueError(f"{len(positives)} positive sets for {len(q)} queries")
    n_docs = len(d)
    for i, pos in enumerate(positives):
        bad = [p for p in pos if not 0 <= int(p) < n_docs]
        if bad:
            raise ValueError(f"query {i}: positive index {bad[0]} out of range for {n_docs} documents")
    if normalize:
        q, d = normalize_rows(q), normalize_rows(d)
    d_unit = d if normalize else normalize_rows(d)
    lo, hi = config.window
    use_margin = config.margin is not None or config.absolute_margin is not None
    negatives: list[list[int]] = []
    neg_scores: list[list[float]] = []
    if len(q) == 0:
        return (negatives, neg_scores) if return_scores else negatives
    # enough candidates for the window: positives are skipped without taking a rank when not counted
    depth = hi if count_positives else hi + max((len(p) for p in positives), default=0)
    scores, idx = exact_search(q, d, depth, query_chunk=query_chunk)
    for i in range(len(q)):
        pos = np.fromiter((int(p) for p in positives[i]), dtype=np.int64)
        if count_positives:
            cand, cs = idx[i, lo - 1 : hi], scores[i, lo - 1 : hi]
            keep = cand >= 0
            if len(pos):
                keep &= ~np.isin(cand, pos)
        else:
            row, row_s = idx[i], scores[i]
            usable = (row >= 0) & ~np.isin(row, pos)
            rank = np.cumsum(usable)  # 1-based rank among non-positive documents
            window = usable & (rank >= lo) & (rank <= hi)
            cand, cs = row[window], row_s[window]
            keep = np.ones(len(cand), dtype=bool)
        if len(pos):
            if use_margin:
                pos_min = float((d[pos] @ q[i]).min())
                keep &= cs <= margin_threshold(pos_min, config.margin, config.absolute_margin)
            if config.embedding_dup_threshold is not None and keep.any():
                sims = d_unit[cand[keep]] @ d_unit[pos].T
                dup = (sims >= config.embedding_dup_threshold).any(axis=1)
                keep[np.nonzero(keep)[0][dup]] = False
        elig = np.nonzero(keep)[0]
        if len(elig) > config.num_negatives:
            if pick == "best":
                elig = elig[: config.num_negatives]
            else:
                rng = np.random.default_rng((config.seed, i))
                elig = np.sort(rng.choice(elig, size=config.num_negatives, replace=False))
        negatives.append([int(x) for x in cand[elig]])
        neg_scores.append([float(x) for x in cs[elig]])
    return (negatives, neg_scores) if return_scores else negatives
