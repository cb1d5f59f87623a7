"""Exact top-k search over sparse ``{term_id: weight}`` vectors by dot product (BM25 and learned weights):
term-major CSR postings, a scipy sparse product, top-k by ``argpartition`` with ties to the lower document.
Hand-written: neither FAISS nor scipy offers exact sparse top-k with persistence; bm25s' is BM25-only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from medadapt.retrieval.errors import IndexCorruptError

SparseVector = Mapping[int, float]


def to_csr(vectors: Sequence[SparseVector], n_terms: int) -> sp.csr_matrix:
    """Stack ``{term_id: weight}`` dicts into a CSR matrix; term ids outside ``[0, n_terms)`` are a ValueError."""
    indptr = np.zeros(len(vectors) + 1, dtype=np.int64)
    for i, v in enumerate(vectors):
        indptr[i + 1] = indptr[i] + len(v)
    indices = np.empty(indptr[-1], dtype=np.int32)
    data = np.empty(indptr[-1], dtype=np.float32)
    for i, v in enumerate(vectors):
        if v:
            indices[indptr[i] : indptr[i + 1]] = np.fromiter(v.keys(), dtype=np.int64, count=len(v))
            data[indptr[i] : indptr[i + 1]] = np.fromiter(v.values(), dtype=np.float64, count=len(v))
    if len(indices) and (indices.min() < 0 or indices.max() >= n_terms):
        raise ValueError(f"term ids must lie in [0, {n_terms})")
    m = sp.csr_matrix((data, indices, indptr), shape=(len(vectors), n_terms))
    m.sum_duplicates()
    return m


def topk_rows(scores: sp.csr_matrix, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` ``(scores, doc_indices)`` of each row of a sparse score matrix, padded with ``-inf`` / ``-1``."""
    n = scores.shape[0]
    out_s = np.full((n, k), -np.inf, dtype=np.float32)
    out_i = np.full((n, k), -1, dtype=np.int64)
    indptr, indices, data = scores.indptr, scores.indices, scores.data
    for r in range(n):
        a, b = indptr[r], indptr[r + 1]
        if a == b:
            continue
        s, idx = data[a:b], indices[a:b]
        if b - a > k:
            # keep every document scoring at least the k-th best, so ties at the cut are resolved exactly
            kth = np.partition(s, len(s) - k)[len(s) - k]
            keep = s >= kth
            s, idx = s[keep], idx[keep]
        order = np.lexsort((idx, -s))[:k]
        out_s[r, : len(order)] = s[order]
        out_i[r, : len(order)] = idx[order]
    return out_s, out_i


class InvertedIndex:
    """Postings (``n_terms × n_docs``)."""

    def __init__(self, postings: sp.csr_matrix):
        self.postings = postings.tocsr()
        self.postings.sort_indices()

    @property
    def n_terms(self) -> int:
        return self.postings.shape[0]

    @property
    def n_docs(self) -> int:
        return self.postings.shape[1]

    @classmethod
    def from_vectors(cls, docs: Sequence[SparseVector], n_terms: int) -> InvertedIndex:
        return cls(to_csr(docs, n_terms).T.tocsr())

    @classmethod
    def from_matrix(cls, doc_term: sp.spmatrix) -> InvertedIndex:
        """From a ``n_docs × n_terms`` sparse matrix (e.g. the output of a sparse encoder)."""
        return cls(sp.csr_matrix(doc_term, dtype=np.float32).T.tocsr())

    def score(self, queries: sp.csr_matrix) -> sp.csr_matrix:
        """Exact dot products of every query with every document sharing a term (``n_queries × n_docs``)."""
        if queries.shape[1] != self.n_terms:
            raise ValueError(f"queries have {queries.shape[1]} terms, index has {self.n_terms}")
        return (queries @ self.postings).tocsr()

    def search(
        self, queries: Sequence[SparseVector] | sp.spmatrix, k: int, batch: int = 256
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores, doc_indices)`` per query, padded with ``-inf`` / ``-1``; documents sharing no
        term with a query are never returned."""
        if not sp.issparse(queries):
            queries = to_csr(list(queries), self.n_terms)
        queries = sp.csr_matrix(queries, dtype=np.float32)
        k = max(1, min(k, self.n_docs))
        out_s = np.empty((queries.shape[0], k), dtype=np.float32)
        out_i = np.empty((queries.shape[0], k), dtype=np.int64)
        for start in range(0, queries.shape[0], batch):
            s, i = topk_rows(self.score(queries[start : start + batch]), k)
            out_s[start : start + len(s)], out_i[start : start + len(s)] = s, i
        return out_s, out_i

    def state(self) -> dict[str, np.ndarray]:
        p = self.postings
        return {
            "postings.indptr": p.indptr.astype(np.int64),
            "postings.indices": p.indices.astype(np.int32),
            "postings.data": p.data.astype(np.float32),
            "postings.shape": np.asarray(p.shape, dtype=np.int64),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray], source: Path | str = "index") -> InvertedIndex:
        try:
            shape = tuple(int(x) for x in state["postings.shape"])
            m = sp.csr_matrix(
                (state["postings.data"], state["postings.indices"], state["postings.indptr"]), shape=shape
            )
            m.check_format(full_check=True)
        except (KeyError, ValueError, TypeError) as exc:
            raise IndexCorruptError(f"{source}: invalid postings ({exc})") from None
        return cls(m)
