"""Exact top-k inner-product search over dense embeddings (FAISS ``IndexFlatIP``, which scores in
blocks internally: no queries × documents matrix is ever materialised)."""

from __future__ import annotations

import numpy as np


def normalize_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def exact_search(
    queries: np.ndarray, docs: np.ndarray, k: int, query_chunk: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(scores, indices)``, each ``n_queries × min(k, n_docs)``, best first.

    Queries are searched ``query_chunk`` at a time so memory stays ``O(query_chunk × k)``.
    """
    import faiss

    queries = np.ascontiguousarray(queries, dtype=np.float32)
    docs = np.ascontiguousarray(docs, dtype=np.float32)
    if queries.ndim != 2 or docs.ndim != 2 or queries.shape[1] != docs.shape[1]:
        raise ValueError(f"dimension mismatch: queries {queries.shape}, documents {docs.shape}")
    k = min(k, docs.shape[0])
    index = faiss.IndexFlatIP(docs.shape[1])
    index.add(docs)
    scores = np.empty((len(queries), k), dtype=np.float32)
    ids = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), query_chunk):
        s, i = index.search(queries[start : start + query_chunk], k)
        scores[start : start + len(s)], ids[start : start + len(s)] = s, i
    return scores, ids


def prepare_for_similarity(emb: np.ndarray, similarity_fn_name: str | None) -> np.ndarray:
    """Make inner product equal the model's similarity: normalise for cosine, keep for dot."""
    name = (similarity_fn_name or "cosine").lower()
    if name == "cosine":
        return normalize_rows(emb)
    if name == "dot":
        return emb
    raise ValueError(f"similarity {similarity_fn_name!r} is not supported for retrieval (use 'cosine' or 'dot')")
