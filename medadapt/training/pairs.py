"""Training pairs from BEIR qrels, their hard negatives, and the cached embeddings heads train on."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from medadapt.curation.fast_mining import mine_from_embeddings
from medadapt.data.beir import BeirDataset
from medadapt.errors import DataError


@dataclass
class TrainingPairs:
    """(query, positive document) pairs of a qrels split, as indices: ``query_ids`` (distinct, in qrels
    order), per pair ``pair_query`` (index into ``query_ids``) and ``pair_doc`` (index into
    ``data.doc_ids``), and per distinct query the set of all its ``positives``."""

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


@dataclass
class HeadTrainingData:
    """Everything the fast path trains a head on: pairs, raw (pre-Normalize) backbone embeddings of the
    distinct training queries and of the whole corpus, and hard negatives per distinct query."""

    pairs: TrainingPairs
    query_raw: np.ndarray
    doc_raw: np.ndarray
    negatives: np.ndarray | None

    def tensors(self):
        """``(query, positive, negatives | None)`` float tensors, one row per pair (see ``train_head``)."""
        pq = self.pairs.pair_query
        n = None if self.negatives is None else torch.from_numpy(self.doc_raw[self.negatives[pq]])
        return torch.from_numpy(self.query_raw[pq]), torch.from_numpy(self.doc_raw[self.pairs.pair_doc]), n


def prepare_head_training(model, data: BeirDataset, split: str, cache, *, mining=None,
                          max_queries: int | None = None, batch_size: int = 64, show_progress: bool = True,
                          log=print) -> HeadTrainingData:
    """Encode (through ``cache``) the training queries and corpus with ``model``'s backbone, and mine hard
    negatives on those embeddings with :func:`medadapt.curation.fast_mining.mine_from_embeddings` when a
    :class:`~medadapt.curation.mining_config.MiningConfig` is given (queries left with fewer eligible
    candidates are padded with random non-positive documents)."""
    pairs = pairs_from_qrels(data, split, max_queries)
    q_raw = cache.encode(model, [data.queries[q] for q in pairs.query_ids], role="query", normalize=False,
                         batch_size=batch_size, show_progress=show_progress, desc="encoding training queries")
    d_raw = cache.encode(model, data.doc_texts(), role="document", normalize=False, batch_size=batch_size,
                         show_progress=show_progress, desc="encoding corpus")
    negatives = None
    if mining is not None:
        t0 = time.perf_counter()
        cosine = (getattr(model, "similarity_fn_name", None) or "cosine") == "cosine"
        mined = mine_from_embeddings(q_raw, d_raw, pairs.positives, mining, normalize=cosine)
        negatives = fill_negatives(mined, pairs.positives, mining.num_negatives, len(d_raw), mining.seed)
        short = sum(len(m) < mining.num_negatives for m in mined)
        log(f"mined {mining.num_negatives} hard negatives for {len(pairs.query_ids)} queries "
            f"(ranks {mining.window[0]}-{mining.window[1]}; {short} padded with random documents) "
            f"in {time.perf_counter() - t0:.1f} s")
    return HeadTrainingData(pairs, q_raw, d_raw, negatives)
