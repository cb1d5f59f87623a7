"""Retrieval and RAG: FAISS dense index, inverted (lexical) index, score fusion, a thread-safe
:class:`Retriever` saved as a checked folder, and LangChain adapters. Models are used through the protocols
of :mod:`medadapt.retrieval.encoders`. Imports are lazy (neither FAISS nor langchain-core is loaded)::

    from medadapt.retrieval import Retriever, load_documents
    r = Retriever.build(load_documents("medmini"), model="minilm", kind="hybrid")
    r.search("how is gout treated?", k=5)

``MedAdaptRetriever`` / ``MedAdaptEmbeddings`` (LangChain) need the ``[langchain]`` extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_MODULES = {
    "retriever": ("Retriever", "SearchResult", "Hit"),
    "config": ("RetrieverConfig", "DenseConfig", "LexicalConfig", "FusionConfig"),
    "dense": ("DenseIndex",),
    "lexical": ("LexicalIndex",),
    "inverted": ("InvertedIndex",),
    "bm25": ("BM25Weighting",),
    "tokenize": ("Tokenizer",),
    "docstore": ("Documents",),
    "corpus": ("load_documents",),
    "fusion": ("minmax_fusion", "zscore_fusion", "rrf_fusion", "sum_fusion", "fuse", "fuse_runs", "hybrid_score",
               "hybrid_topk"),
    "exact": ("exact_search",),
    "late": ("MaxSimReranker", "MaxSimConfig", "TokenVectorCache"),
    "encoders": ("Encoder", "DenseEncoder", "SparseEncoder", "HybridEncoder", "SentenceTransformerEncoder",
                 "open_encoder"),
    "sharding": ("build_shard", "merge_shards", "train_shard_template"),
    "errors": ("IndexMismatchError", "IndexCorruptError"),
    "langchain": ("MedAdaptRetriever", "MedAdaptEmbeddings"),
    "langchain_qdrant": ("MedAdaptQdrantVectorStore", "qdrant_vector_store"),
    "upgrade": ("upgrade_queries", "upgrade_qdrant_queries", "UpgradeResult"),
}
_LAZY = {name: f"medadapt.retrieval.{module}" for module, names in _MODULES.items() for name in names}

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
    from medadapt.retrieval.late import MaxSimConfig, MaxSimReranker, TokenVectorCache
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
