"""BM25 as sparse vectors: documents ``{term_id: bm25 weight}``, queries ``{term_id: count}``; their dot product
is bm25s' Lucene BM25 (equal to float32 precision). Hand-written because bm25s keeps its weights in its own
object; here they are plain sparse vectors for the shared :class:`~medadapt.retrieval.inverted.InvertedIndex`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp


class BM25Weighting:
    """Vocabulary (term -> id), document frequencies per term id, corpus size, mean document length (tokens)
    and the BM25 parameters of an index."""

    def __init__(self, vocab: dict[str, int], df: np.ndarray, n_docs: int, avgdl: float, k1: float = 1.5,
                 b: float = 0.75):
        self.vocab = vocab
        self.df = np.asarray(df, dtype=np.int64)
        self.n_docs = int(n_docs)
        self.avgdl = float(avgdl)
        self.k1 = float(k1)
        self.b = float(b)
        self.idf = np.log(1.0 + (self.n_docs - self.df + 0.5) / (self.df + 0.5))

    @classmethod
    def fit(cls, docs_tokens: Iterable[Sequence[str]], k1: float = 1.5, b: float = 0.75
            ) -> tuple[BM25Weighting, sp.csr_matrix]:
        """``(weighting, doc_term)``: the vocabulary and each document's BM25 term weights (``n_docs × n_terms``)."""
        vocab: dict[str, int] = {}
        rows, cols, tfs, lengths = [], [], [], []
        for i, tokens in enumerate(docs_tokens):
            counts = Counter(vocab.setdefault(t, len(vocab)) for t in tokens)
            lengths.append(len(tokens))
            rows.append(np.full(len(counts), i, dtype=np.int64))
            cols.append(np.fromiter(counts.keys(), dtype=np.int64, count=len(counts)))
            tfs.append(np.fromiter(counts.values(), dtype=np.float64, count=len(counts)))
        n_docs = len(lengths)
        r = np.concatenate(rows) if rows else np.zeros(0, np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, np.int64)
        tf = np.concatenate(tfs) if tfs else np.zeros(0)
        lengths_arr = np.asarray(lengths, dtype=np.float64)
        avgdl = float(lengths_arr.mean()) if n_docs else 0.0
        df = np.bincount(c, minlength=len(vocab))
        weighting = cls(vocab, df, n_docs, avgdl, k1, b)
        norm = k1 * (1 - b + b * lengths_arr[r] / max(avgdl, 1e-9))
        w = weighting.idf[c] * tf / (tf + norm)
        matrix = sp.csr_matrix((w.astype(np.float32), (r, c)), shape=(n_docs, len(vocab)))
        return weighting, matrix

    def query_vector(self, tokens: Sequence[str]) -> dict[int, float]:
        """``{term_id: count}`` over the query terms known to the index (unknown terms score 0)."""
        ids = [self.vocab[t] for t in tokens if t in self.vocab]
        return {int(t): float(c) for t, c in Counter(ids).items()}

    def query_matrix(self, queries_tokens: Sequence[Sequence[str]]) -> sp.csr_matrix:
        """Query vectors stacked as CSR (``n_queries × n_terms``)."""
        vocab = self.vocab
        indptr = [0]
        indices: list[int] = []
        for tokens in queries_tokens:
            indices.extend(vocab[t] for t in tokens if t in vocab)
            indptr.append(len(indices))
        m = sp.csr_matrix(
            (np.ones(len(indices), dtype=np.float32), np.asarray(indices, dtype=np.int32),
             np.asarray(indptr, dtype=np.int64)),
            shape=(len(queries_tokens), len(vocab)),
        )
        m.sum_duplicates()  # repeated terms add up, as in bm25s
        return m

    def to_json(self) -> dict:
        terms = [""] * len(self.vocab)
        for t, i in self.vocab.items():
            terms[i] = t
        return {"terms": terms, "n_docs": self.n_docs, "avgdl": self.avgdl, "k1": self.k1, "b": self.b}

    def state(self) -> dict[str, np.ndarray]:
        return {"bm25.df": self.df}

    @classmethod
    def from_json(cls, obj: Mapping, state: Mapping[str, np.ndarray]) -> BM25Weighting:
        vocab = {t: i for i, t in enumerate(obj["terms"])}
        return cls(vocab, state["bm25.df"], obj["n_docs"], obj["avgdl"], obj["k1"], obj["b"])
