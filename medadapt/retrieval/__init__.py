"""Retrieval and RAG: FAISS dense index, inverted (lexical) index, score fusion, a thread-safe
:class:`Retriever` saved as a checked folder, and LangChain adapters.

Models are used through the protocols of :mod:`medadapt.retrieval.encoders` (dense, learned sparse or
both); nothing here imports a system package. Imports are lazy so ``import medadapt.retrieval`` loads
neither FAISS nor langchain-core::

    from medadapt.retrieval import Retriever, load_documents
    r = Retriever.build(load_documents("medmini"), model="minilm", kind="hybrid")
    r.search("how is gout treated?", k=5)

``MedAdaptRetriever`` / ``MedAdaptEmbeddings`` (LangChain) need the ``[langchain]`` extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "Retriever": "medadapt.retrieval.retriever",
    "SearchResult": "medadapt.retrieval.retriever",
    "Hit": "medadapt.retrieval.retriever",
    "RetrieverConfig": "medadapt.retrieval.config",
    "DenseConfig": "medadapt.retrieval.config",
    "LexicalConfig": "medadapt.retrieval.config",
    "FusionConfig": "medadapt.retrieval.config",
    "DenseIndex": "medadapt.retrieval.dense",
    "LexicalIndex": "medadapt.retrieval.lexical",
    "InvertedIndex": "medadapt.retrieval.inverted",
    "BM25Weighting": "medadapt.retrieval.bm25",
    "Tokenizer": "medadapt.retrieval.tokenize",
    "Documents": "medadapt.retrieval.docstore",
    "load_documents": "medadapt.retrieval.corpus",
    "minmax_fusion": "medadapt.retrieval.fusion",
    "zscore_fusion": "medadapt.retrieval.fusion",
    "rrf_fusion": "medadapt.retrieval.fusion",
    "sum_fusion": "medadapt.retrieval.fusion",
    "fuse": "medadapt.retrieval.fusion",
    "fuse_runs": "medadapt.retrieval.fusion",
    "hybrid_score": "medadapt.retrieval.fusion",
    "hybrid_topk": "medadapt.retrieval.fusion",
    "exact_search": "medadapt.retrieval.exact",
    "Encoder": "medadapt.retrieval.encoders",
    "DenseEncoder": "medadapt.retrieval.encoders",
    "SparseEncoder": "medadapt.retrieval.encoders",
    "HybridEncoder": "medadapt.retrieval.encoders",
    "SentenceTransformerEncoder": "medadapt.retrieval.encoders",
    "open_encoder": "medadapt.retrieval.encoders",
    "build_shard": "medadapt.retrieval.sharding",
    "merge_shards": "medadapt.retrieval.sharding",
    "train_shard_template": "medadapt.retrieval.sharding",
    "IndexMismatchError": "medadapt.retrieval.errors",
    "IndexCorruptError": "medadapt.retrieval.errors",
    "MedAdaptRetriever": "medadapt.retrieval.langchain",
    "MedAdaptEmbeddings": "medadapt.retrieval.langchain",
    "MedAdaptQdrantVectorStore": "medadapt.retrieval.langchain_qdrant",
    "qdrant_vector_store": "medadapt.retrieval.langchain_qdrant",
    "upgrade_queries": "medadapt.retrieval.upgrade",
    "upgrade_qdrant_queries": "medadapt.retrieval.upgrade",
    "UpgradeResult": "medadapt.retrieval.upgrade",
}

__all__ = sorted(_LAZY)

if TYPE_CHECKING:  # pragma: no cover
    from medadapt.retrieval.bm25 import BM25Weighting
    from medadapt.retrieval.config import DenseConfig, FusionConfig, LexicalConfig, RetrieverConfig
    from medadapt.retrieval.corpus import load_documents
    from medadapt.retrieval.dense import DenseIndex
    from medadapt.retrieval.docstore import Documents
    from medadapt.retrieval.errors import IndexCorruptError, IndexMismatchError
    from medadapt.retrieval.encoders import (
        DenseEncoder,
        Encoder,
        HybridEncoder,
        SentenceTransformerEncoder,
        SparseEncoder,
        open_encoder,
    )
    from medadapt.retrieval.exact import exact_search
    from medadapt.retrieval.fusion import (
        fuse,
        fuse_runs,
        hybrid_score,
        hybrid_topk,
        minmax_fusion,
        rrf_fusion,
        sum_fusion,
        zscore_fusion,
    )
    from medadapt.retrieval.inverted import InvertedIndex
    from medadapt.retrieval.langchain import MedAdaptEmbeddings, MedAdaptRetriever
    from medadapt.retrieval.langchain_qdrant import MedAdaptQdrantVectorStore, qdrant_vector_store
    from medadapt.retrieval.lexical import LexicalIndex
    from medadapt.retrieval.retriever import Hit, Retriever, SearchResult
    from medadapt.retrieval.sharding import build_shard, merge_shards, train_shard_template
    from medadapt.retrieval.tokenize import Tokenizer
    from medadapt.retrieval.upgrade import UpgradeResult, upgrade_qdrant_queries, upgrade_queries


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'medadapt.retrieval' has no attribute {name!r}")
