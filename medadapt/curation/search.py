"""The search protocol that decouples curation from any retriever: ``search(query_texts, k)`` -> per query
``[(doc_id, score), ...]`` best first, and optionally ``score(query_texts, doc_ids)`` (a positive's score for
the false-negative margin when it was not retrieved). See docs/curation.md, "Searchers".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from medadapt.progress import progress

Hit = tuple[str, float]


@runtime_checkable
class Searcher(Protocol):
    def __call__(self, query_texts: list[str], k: int) -> list[list[Hit]]: ...


@runtime_checkable
class Scorer(Protocol):
    def score(self, query_texts: list[str], doc_ids: list[list[str]]) -> list[list[float]]: ...


def batched_search(
    searcher: Searcher, query_texts: Sequence[str], k: int, batch_size: int = 256, show_progress: bool = True,
    desc: str = "searching",
) -> list[list[Hit]]:
    """``searcher`` on ``batch_size`` queries at a time, with a progress bar and a shape check."""
    out: list[list[Hit]] = []
    query_texts = list(query_texts)
    with progress(total=len(query_texts), desc=desc, unit="query", disable=not show_progress) as bar:
        for start in range(0, len(query_texts), batch_size):
            batch = query_texts[start : start + batch_size]
            hits = searcher(batch, k)
            if len(hits) != len(batch):
                raise ValueError(f"searcher returned {len(hits)} result lists for {len(batch)} queries")
            out.extend([(str(d), float(s)) for d, s in row] for row in hits)
            bar.update(len(batch))
    return out


def checked_corpus_ids(corpus_ids, corpus_texts) -> list[str]:
    """Corpus ids as strings, after checking they are unique, non-empty and one per text."""
    ids = [str(i) for i in corpus_ids]
    if len(ids) != len(corpus_texts):
        raise ValueError(f"{len(ids)} corpus ids but {len(corpus_texts)} texts")
    if len(set(ids)) != len(ids):
        raise ValueError("corpus ids must be unique")
    if not ids:
        raise ValueError("the corpus is empty")
    return ids
