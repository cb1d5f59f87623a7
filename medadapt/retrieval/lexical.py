"""The lexical index: BM25 (:meth:`LexicalIndex.build_bm25`) or learned ``{term_id: weight}`` vectors
(:meth:`LexicalIndex.from_sparse`) on the inverted-index engine, saved as ``lexical.safetensors`` + ``.json``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from medadapt.io import atomic_open, atomic_write_json
from medadapt.progress import progress
from medadapt.retrieval.bm25 import BM25Weighting
from medadapt.retrieval.config import LexicalConfig
from medadapt.retrieval.errors import IndexCorruptError
from medadapt.retrieval.inverted import InvertedIndex, SparseVector
from medadapt.retrieval.tokenize import Tokenizer, detect_language

FILES = ("lexical.safetensors", "lexical.json")


class LexicalIndex:
    """Exact top-k lexical search (BM25 or learned sparse weights)."""

    def __init__(self, engine: InvertedIndex, config: LexicalConfig, weighting: BM25Weighting | None = None,
                 language: str | None = None):
        self.engine = engine
        self.config = config
        self.weighting = weighting
        self.language = language
        self.tokenizer = (
            Tokenizer(language, config.stopwords, config.stem) if weighting is not None and language else None
        )

    @property
    def n_docs(self) -> int:
        return self.engine.n_docs

    @property
    def kind(self) -> str:
        return "bm25" if self.weighting is not None else "sparse"

    @classmethod
    def build_bm25(cls, texts: Sequence[str], config: LexicalConfig | None = None,
                   show_progress: bool = True) -> LexicalIndex:
        config = config or LexicalConfig()
        language = detect_language(texts) if config.language == "auto" else config.language
        tokenizer = Tokenizer(language, config.stopwords, config.stem)
        tokens = (tokenizer(t) for t in progress(texts, desc="tokenising corpus", unit="doc",
                                               disable=not show_progress))
        weighting, doc_term = BM25Weighting.fit(tokens, config.k1, config.b)
        return cls(InvertedIndex.from_matrix(doc_term), config, weighting, language)

    @classmethod
    def from_sparse(cls, docs: Sequence[SparseVector] | sp.spmatrix, n_terms: int | None = None,
                    config: LexicalConfig | None = None) -> LexicalIndex:
        """Index precomputed sparse document vectors (``n_docs × n_terms`` matrix or dicts)."""
        if sp.issparse(docs):
            engine = InvertedIndex.from_matrix(docs)
        else:
            if n_terms is None:
                n_terms = 1 + max((max(d) for d in docs if d), default=0)
            engine = InvertedIndex.from_vectors(docs, n_terms)
        return cls(engine, config or LexicalConfig(), None, None)

    def encode_queries(self, queries: Sequence[str]) -> sp.csr_matrix:
        if self.weighting is None or self.tokenizer is None:
            raise TypeError("this lexical index holds learned sparse vectors: pass query vectors, not strings")
        return self.weighting.query_matrix([self.tokenizer(q) for q in queries])

    def search(self, queries: Sequence[str] | Sequence[SparseVector] | sp.spmatrix, k: int
               ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` ``(scores, doc_indices)`` per query; strings are tokenised, sparse vectors used as is."""
        if not sp.issparse(queries) and len(queries) and isinstance(queries[0], str):
            queries = self.encode_queries(queries)  # type: ignore[arg-type]
        return self.engine.search(queries, k)

    def save(self, folder: str | Path) -> None:
        from safetensors.numpy import save

        folder = Path(folder)
        state = self.engine.state()
        meta = {"kind": self.kind, "language": self.language, "config": self.config.model_dump()}
        if self.weighting is not None:
            state.update(self.weighting.state())
            meta["bm25"] = self.weighting.to_json()
        with atomic_open(folder / "lexical.safetensors", "wb") as f:
            f.write(save(state))
        atomic_write_json(folder / "lexical.json", meta, indent=None)

    @classmethod
    def load(cls, folder: str | Path) -> LexicalIndex:
        from safetensors.numpy import load_file

        folder = Path(folder)
        try:
            meta = json.loads((folder / "lexical.json").read_text(encoding="utf-8"))
            state = load_file(str(folder / "lexical.safetensors"))
        except (OSError, ValueError) as exc:
            raise IndexCorruptError(f"{folder}: cannot read the lexical index ({exc})") from None
        engine = InvertedIndex.from_state(state, folder / "lexical.safetensors")
        config = LexicalConfig(**meta["config"])
        weighting = BM25Weighting.from_json(meta["bm25"], state) if meta["kind"] == "bm25" else None
        return cls(engine, config, weighting, meta.get("language"))
