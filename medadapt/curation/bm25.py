"""BM25 searcher adapter (bm25s, Lucene BM25 defaults k1=1.5, b=0.75).

English: bm25s tokenizer (lower-cased, ``\\w\\w+`` tokens), English stopwords, Snowball stemming via
PyStemmer. Chinese: jieba search-mode segmentation (``lcut_for_search``), whitespace and punctuation
tokens dropped. The same choices as ``benchmarks/eval_baselines.py``. Documents with a BM25 score of 0
(no shared term) are never returned.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

import numpy as np

from medadapt.curation.search import Hit, checked_corpus_ids

_PUNCT = re.compile(r"^[\W_]+$", re.UNICODE)


class BM25Searcher:
    """Searcher over a fixed corpus with BM25.

    Args:
        corpus_ids / corpus_texts: the documents (same length, ids unique).
        language: ``"en"`` (stopwords + Snowball stemmer) or ``"zh"`` (jieba).
    """

    def __init__(self, corpus_ids: Sequence[str], corpus_texts: Sequence[str],
                 language: Literal["en", "zh"] = "en", show_progress: bool = False):
        import bm25s

        if language not in ("en", "zh"):
            raise ValueError(f"language must be 'en' or 'zh', got {language!r}")
        corpus_ids = checked_corpus_ids(corpus_ids, corpus_texts)
        self.language = language
        self.corpus_ids = corpus_ids
        self._pos = {d: i for i, d in enumerate(corpus_ids)}
        self._stemmer = None
        if language == "en":
            import Stemmer

            self._stemmer = Stemmer.Stemmer("english")
        self.retriever = bm25s.BM25()
        self.retriever.index(self.tokenize(list(corpus_texts)), show_progress=show_progress)

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        if self.language == "zh":
            import jieba

            jieba.setLogLevel(60)
            return [[w for w in jieba.lcut_for_search(t) if w.strip() and not _PUNCT.match(w)] for t in texts]
        import bm25s

        return bm25s.tokenize(texts, stopwords="en", stemmer=self._stemmer, return_ids=False,
                              show_progress=False)

    def __call__(self, query_texts: list[str], k: int) -> list[list[Hit]]:
        if not query_texts:
            return []
        tokens = self.tokenize(list(query_texts))
        k = min(k, len(self.corpus_ids))
        out: list[list[Hit]] = [[] for _ in tokens]
        nonempty = [i for i, t in enumerate(tokens) if t]
        if nonempty and k > 0:
            docs, scores = self.retriever.retrieve([tokens[i] for i in nonempty], k=k, show_progress=False)
            for row, i in enumerate(nonempty):
                out[i] = [(self.corpus_ids[int(d)], float(s))
                          for d, s in zip(docs[row], scores[row]) if s > 0]
        return out

    def score(self, query_texts: list[str], doc_ids: list[list[str]]) -> list[list[float]]:
        """BM25 score of each query with the given documents (0 for no shared term)."""
        out = []
        for tokens, ids in zip(self.tokenize(list(query_texts)), doc_ids):
            all_scores = self.retriever.get_scores(tokens) if tokens else np.zeros(len(self.corpus_ids))
            out.append([float(all_scores[self._pos[d]]) for d in ids])
        return out
