"""Training pairs from BEIR qrels, and their hard negatives."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from medadapt.data.beir import BeirDataset
from medadapt.errors import DataError


@dataclass
class TrainingPairs:
    """(query, positive document) pairs of a qrels split, as indices.

    Attributes:
        query_ids: distinct training query ids (order of first appearance in the qrels).
        pair_query: for each pair, its index into ``query_ids``.
        pair_doc: for each pair, the positive's index into ``data.doc_ids``.
        positives: for each distinct query, the set of all its positive document indices.
    """

    query_ids: list[str]
    pair_query: np.ndarray
    pair_doc: np.ndarray
    positives: list[set[int]]

    def __len__(self) -> int:
        return len(self.pair_query)


def pairs_from_qrels(data: BeirDataset, split: str, max_queries: int | None = None) -> TrainingPairs:
    """Every (query, document) judgement with grade > 0 in ``split`` becomes a pair."""
    if split not in data.qrels:
        raise DataError(f"training split {split!r} is not loaded")
    doc_index = {d: i for i, d in enumerate(data.doc_ids)}
    query_ids, pq, pd, positives = [], [], [], []
    for qid, rel in data.qrels[split].items():
        pos = [doc_index[d] for d, g in rel.items() if g > 0]
        if not pos:
            continue
        if max_queries is not None and len(query_ids) >= max_queries:
            break
        qi = len(query_ids)
        query_ids.append(qid)
        positives.append(set(pos))
        pq.extend([qi] * len(pos))
        pd.extend(pos)
    if not pq:
        raise DataError(f"split {split!r} has no positive (grade > 0) judgements to train on")
    return TrainingPairs(query_ids, np.asarray(pq, dtype=np.int64), np.asarray(pd, dtype=np.int64), positives)


def fill_negatives(negatives: list[list[int]], positives: list[set[int]], num: int, n_docs: int,
                   seed: int) -> np.ndarray:
    """Pad each query's mined negatives to exactly ``num`` with random non-positive documents (seeded per
    query), so every training pair carries the same number of negatives. Returns ``n_queries × num``."""
    out = np.empty((len(negatives), num), dtype=np.int64)
    for i, (negs, pos) in enumerate(zip(negatives, positives)):
        chosen = list(negs[:num])
        rng = np.random.default_rng((seed, i, 1))
        while len(chosen) < num:
            cand = int(rng.integers(n_docs))
            if cand not in pos and cand not in chosen:
                chosen.append(cand)
        out[i] = chosen
    return out
