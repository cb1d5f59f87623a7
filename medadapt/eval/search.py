"""Exact top-k inner-product search (FAISS ``IndexFlatIP``): :mod:`medadapt.retrieval.exact`'s, by its old path."""

from __future__ import annotations

from medadapt.retrieval.exact import (
    exact_search,
    normalize_rows,
    prepare_for_similarity,
    similarity_is_cosine,
)

__all__ = ["exact_search", "normalize_rows", "prepare_for_similarity", "similarity_is_cosine"]
