"""LangChain adapters (extra ``[langchain]``: langchain-core only): :class:`MedAdaptRetriever` (a
``BaseRetriever`` over a Retriever or QdrantRetriever) and :class:`MedAdaptEmbeddings`. See docs/retrieval.md."""

from __future__ import annotations

import threading
from typing import Any

try:
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    from medadapt.errors import MedAdaptError

    raise MedAdaptError("the LangChain adapters need langchain-core: pip install 'medadapt[langchain]'") from exc

from pydantic import ConfigDict, Field

from medadapt.errors import DataError
from medadapt.models import load
from medadapt.retrieval.dense import uses_cosine


def _checked(query: Any) -> str:
    """``query`` if it is a non-blank string; else :class:`DataError` (an empty query retrieves arbitrary
    documents)."""
    if not isinstance(query, str):
        raise DataError(f"the query must be a string, not {type(query).__name__}")
    if not query.strip():
        raise DataError("the query is empty")
    return query


class MedAdaptRetriever(BaseRetriever):
    """A LangChain retriever over a medadapt index; documents carry ``id``, ``score``, ``rank``, ``title`` and
    ``kind`` in their metadata."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any = Field(description="a medadapt.retrieval.Retriever, or any object with search(query, k) -> "
                                       "SearchResult and kind, such as medadapt.retrieval.vectordb.QdrantRetriever")
    k: int = Field(10, ge=1, description="documents returned per query")

    def _to_documents(self, result) -> list[Document]:
        kind = self.retriever.kind
        return [
            Document(
                page_content=hit.text,
                id=hit.id,
                metadata={"id": hit.id, "score": hit.score, "rank": hit.rank, "title": hit.title, "kind": kind},
            )
            for hit in result
        ]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        # BaseRetriever's async path runs this in a worker thread (searches are thread-safe)
        return self._to_documents(self.retriever.search(_checked(query), self.k))


class MedAdaptEmbeddings(Embeddings):
    """LangChain ``Embeddings`` over a SentenceTransformer or a name for :func:`medadapt.load`
    (``encode_query`` / ``encode_document``), normalised when the model's similarity is cosine."""

    def __init__(self, model: Any = "minilm", batch_size: int = 64):
        if isinstance(model, str):
            model = load(model)
        self.model = model
        self.batch_size = batch_size
        self.normalize = uses_cosine(model)
        self._lock = threading.Lock()

    def _encode(self, fn, texts: list[str]) -> list[list[float]]:
        with self._lock:
            emb = fn(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                     normalize_embeddings=self.normalize, show_progress_bar=False)
        return emb.astype("float32").tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._encode(self.model.encode_document, texts)

    def embed_query(self, text: str) -> list[float]:
        return self._encode(self.model.encode_query, [text])[0]
