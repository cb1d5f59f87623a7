"""BM25 searcher for curation on medadapt's one BM25 engine
(:meth:`medadapt.retrieval.lexical.LexicalIndex.build_bm25`: English stemmed, Chinese jieba). Documents with
score 0 (no shared term) are never returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from medadapt.curation.search import Hit, checked_corpus_ids
from medadapt.retrieval.config import LexicalConfig
from medadapt.retrieval.lexical import LexicalIndex


class BM25Searcher:
    """Searcher over a fixed corpus (unique ids) with BM25; ``language`` ``en`` or ``zh``."""

    def __init__(self, corpus_ids: Sequence[str], corpus_texts: Sequence[str],
                 language: Literal["en", "zh"] = "en", show_progress: bool = False):
        if language not in ("en", "zh"):
            raise ValueError(f"language must be 'en' or 'zh', got {language!r}")
        corpus_ids = checked_corpus_ids(corpus_ids, corpus_texts)
        self.language = language
        self.corpus_ids = corpus_ids
        self._pos = {d: i for i, d in enumerate(corpus_ids)}
        self.index = LexicalIndex.build_bm25(list(corpus_texts), LexicalConfig(language=language),
                                             show_progress=show_progress)

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        """The index's tokens of each text (what BM25 matches on)."""
        return [self.index.tokenizer(t) for t in texts]

    def __call__(self, query_texts: list[str], k: int) -> list[list[Hit]]:
        if not query_texts or k <= 0:
            return [[] for _ in query_texts]
        scores, idx = self.index.search(list(query_texts), min(k, len(self.corpus_ids)))
        return [[(self.corpus_ids[int(d)], float(s)) for s, d in zip(srow, irow) if d >= 0 and s > 0]
                for srow, irow in zip(scores, idx)]

    def score(self, query_texts: list[str], doc_ids: list[list[str]]) -> list[list[float]]:
        """BM25 score of each query with the given documents (0 for no shared term)."""
        scores = self.index.engine.score(self.index.encode_queries(list(query_texts)))
        out = []
        for row, ids in enumerate(doc_ids):  # read only the asked documents' entries of the sparse row
            cols = [self._pos[d] for d in ids]
            out.append([float(x) for x in scores[row, cols].toarray().ravel()] if cols else [])
        return out
