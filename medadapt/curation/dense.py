"""Dense searcher: a SentenceTransformer through the embedding cache (``encode_query`` /
``encode_document``, so asymmetric and prompted models search correctly) and exact search."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from medadapt.cache import EmbeddingCache
from medadapt.curation.search import Hit, checked_corpus_ids
from medadapt.eval.search import exact_search, prepare_for_similarity


class DenseSearcher:
    """Searcher over a fixed corpus (unique ids). Document embeddings are computed on first use and kept;
    the model must not change while the searcher is used (its fingerprint is taken once)."""

    def __init__(self, model, corpus_ids: Sequence[str], corpus_texts: Sequence[str], cache=None,
                 batch_size: int = 64, show_progress: bool = True):
        corpus_ids = checked_corpus_ids(corpus_ids, corpus_texts)
        self.model = model
        self.corpus_ids = corpus_ids
        self.corpus_texts = list(corpus_texts)
        self.cache = cache if cache is not None else EmbeddingCache()
        self.batch_size = batch_size
        self.show_progress = show_progress
        self._pos = {d: i for i, d in enumerate(corpus_ids)}
        self._docs: np.ndarray | None = None
        self._query_fp: str | None = None

    def _prepare(self, emb: np.ndarray) -> np.ndarray:
        return prepare_for_similarity(np.asarray(emb, dtype=np.float32),
                                      getattr(self.model, "similarity_fn_name", None))

    @property
    def doc_embeddings(self) -> np.ndarray:
        if self._docs is None:
            emb = self.cache.encode(self.model, self.corpus_texts, role="document",
                                    batch_size=self.batch_size, show_progress=self.show_progress,
                                    desc="encoding corpus")
            self._docs = self._prepare(emb)
        return self._docs

    def encode_queries(self, query_texts: Sequence[str]) -> np.ndarray:
        if self._query_fp is None:
            self._query_fp = self.cache.role_fingerprint(self.model, "query")
        emb = self.cache.encode(self.model, list(query_texts), role="query", batch_size=self.batch_size,
                                show_progress=False, fingerprint=self._query_fp)
        return self._prepare(emb)

    def __call__(self, query_texts: list[str], k: int) -> list[list[Hit]]:
        if not query_texts:
            return []
        docs = self.doc_embeddings
        scores, idx = exact_search(self.encode_queries(query_texts), docs, k)
        return [[(self.corpus_ids[j], float(s)) for s, j in zip(srow, irow) if j >= 0]
                for srow, irow in zip(scores, idx)]

    def score(self, query_texts: list[str], doc_ids: list[list[str]]) -> list[list[float]]:
        """Similarity of each query with the given documents."""
        if not query_texts:
            return []
        q = self.encode_queries(query_texts)
        docs = self.doc_embeddings
        out = []
        for qv, ids in zip(q, doc_ids):
            rows = [self._pos[d] for d in ids]
            out.append([float(x) for x in docs[rows] @ qv] if rows else [])
        return out
