"""The one exact top-k inner-product search of medadapt (FAISS ``IndexFlatIP`` in query chunks: no queries ×
documents matrix) and the helpers every dense path shares (row normalisation, cosine / dot). Imports only
numpy at module level, so light modules and :mod:`medadapt.eval.search` can build on it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["exact_search", "normalize_rows", "prepare_for_similarity", "similarity_is_cosine"]


def normalize_rows(x: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (rows of norm 0 stay 0); the dtype is kept."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def similarity_is_cosine(similarity_fn_name: str | None) -> bool:
    """``True`` for ``cosine`` (the default), ``False`` for ``dot``; any other similarity is a ValueError."""
    name = (similarity_fn_name or "cosine").lower()
    if name not in ("cosine", "dot"):
        raise ValueError(f"similarity {similarity_fn_name!r} is not supported for retrieval (use 'cosine' or 'dot')")
    return name == "cosine"


def prepare_for_similarity(emb: np.ndarray, similarity_fn_name: str | None) -> np.ndarray:
    """Make inner product equal the model's similarity: normalise for cosine, keep for dot."""
    return normalize_rows(emb) if similarity_is_cosine(similarity_fn_name) else emb


def exact_search(
    queries: np.ndarray, docs: np.ndarray, k: int, query_chunk: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, indices)``, each ``n_queries × min(k, n_docs)``, best first (``query_chunk`` queries at a time)."""
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
