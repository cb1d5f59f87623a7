"""Exact top-k inner-product search over dense embeddings (FAISS ``IndexFlatIP``).

The implementation lives in :mod:`medadapt.retrieval.exact` (the one exact search of medadapt); these are
the names evaluation code has always imported from here.
"""

from __future__ import annotations

from medadapt.retrieval.exact import exact_search, normalize_rows, prepare_for_similarity, similarity_is_cosine

__all__ = ["exact_search", "normalize_rows", "prepare_for_similarity", "similarity_is_cosine"]
