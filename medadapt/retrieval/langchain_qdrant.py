"""LangChain's ``QdrantVectorStore`` over a medadapt collection (needs ``pip install langchain-qdrant``).

Dense, sparse or hybrid mode (Qdrant's server-side RRF with the collection's ``rrf_k + 1``: Qdrant counts
positions from 0); queries are encoded as :class:`~medadapt.retrieval.vectordb.QdrantRetriever` encodes them. A
subclass, because a medadapt collection keeps ``doc_id`` / ``title`` / ``text`` flat in the payload where
LangChain reads a nested ``metadata`` dict: one overridden method lets existing collections serve LangChain.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_qdrant import QdrantVectorStore, RetrievalMode
    from langchain_qdrant.sparse_embeddings import SparseEmbeddings, SparseVector
except ImportError as exc:  # pragma: no cover - exercised only without the package
    from medadapt.errors import MedAdaptError

    raise MedAdaptError("LangChain's Qdrant store needs langchain-qdrant: pip install langchain-qdrant") from exc

from medadapt.errors import ConfigError
from medadapt.retrieval.exact import normalize_rows
from medadapt.retrieval.vectordb import DENSE, SPARSE, QdrantRetriever, _distance, _models

__all__ = ["MedAdaptQdrantVectorStore", "qdrant_vector_store"]

_MODES = {"dense": RetrievalMode.DENSE, "sparse": RetrievalMode.SPARSE, "hybrid": RetrievalMode.HYBRID}


class _DenseQueries(Embeddings):
    """Dense vectors exactly as the collection stores them (the recorded model, normalised when it is)."""

    def __init__(self, retriever: QdrantRetriever):
        self.retriever = retriever

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        vecs = np.asarray(self.retriever.encoder.encode_document(list(texts)), dtype=np.float32)
        return (normalize_rows(vecs) if self.retriever.normalized else vecs).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.retriever._dense_queries([text])[0].tolist()


class _SparseQueries(SparseEmbeddings):
    """Sparse query vectors as the collection expects them (BM25 terms, or the model's learned weights)."""

    def __init__(self, retriever: QdrantRetriever):
        self.retriever = retriever

    def embed_documents(self, texts: list[str]) -> list[SparseVector]:
        raise ConfigError("documents of a medadapt collection are written by medadapt.retrieval.export_to_qdrant")

    def embed_query(self, text: str) -> SparseVector:
        v = self.retriever._sparse_queries([text])[0]
        return SparseVector(indices=list(v.indices), values=list(v.values))


class MedAdaptQdrantVectorStore(QdrantVectorStore):
    """``QdrantVectorStore`` whose hybrid RRF uses the collection's constant and whose documents carry
    medadapt's ``id`` and ``title`` (``Document.id`` is the corpus id)."""

    medadapt_fusion: Any = None

    def similarity_search_with_score(self, query: str, k: int = 4, *args, **kwargs):
        if kwargs.get("hybrid_fusion") is None and self.medadapt_fusion is not None:
            kwargs["hybrid_fusion"] = self.medadapt_fusion
        return super().similarity_search_with_score(query, k, *args, **kwargs)

    @classmethod
    def _document_from_point(cls, scored_point: Any, collection_name: str, content_payload_key: str,
                             metadata_payload_key: str) -> Document:
        payload = scored_point.payload or {}
        doc_id = str(payload.get("doc_id", scored_point.id))
        return Document(id=doc_id, page_content=payload.get(content_payload_key, ""),
                        metadata={"id": doc_id, "title": payload.get("title", ""), "_id": scored_point.id,
                                  "_collection_name": collection_name})


def qdrant_vector_store(client, collection: str, model: Any = None, *, mode: str | None = None,
                        device: str | None = None) -> MedAdaptQdrantVectorStore:
    """A LangChain ``QdrantVectorStore`` reading the medadapt collection ``collection`` (``model`` as in
    :class:`~medadapt.retrieval.vectordb.QdrantRetriever`); ``mode`` ``"dense"``, ``"sparse"`` or ``"hybrid"``,
    by default the collection's kind. An unknown mode, or one the collection has no vectors for, is a
    :class:`ConfigError`."""
    retriever = QdrantRetriever(client, collection, model=model, device=device)
    kind = retriever.kind
    mode = mode or {"lexical": "sparse"}.get(kind, kind)
    if mode not in _MODES:
        raise ConfigError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    have = {"dense": {"dense"}, "lexical": {"sparse"}, "hybrid": {"dense", "sparse", "hybrid"}}[kind]
    if mode not in have:
        raise ConfigError(f"collection {collection!r} is {kind}: it has no vectors for mode {mode!r}")
    fusion = None
    if mode == "hybrid":
        models = _models()
        fusion = models.RrfQuery(rrf=models.Rrf(k=retriever.config.fusion.rrf_k + 1))
    store = MedAdaptQdrantVectorStore(
        client, collection,
        embedding=_DenseQueries(retriever) if mode != "sparse" else None,
        retrieval_mode=_MODES[mode], vector_name=DENSE,
        sparse_embedding=_SparseQueries(retriever) if mode != "dense" else None,
        sparse_vector_name=SPARSE, content_payload_key="text",
        distance=_distance(retriever.normalized))
    store.medadapt_fusion = fusion
    return store

