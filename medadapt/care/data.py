"""Training items for the asymmetric stages, from a BEIR folder: unlabeled texts for stage I
(:func:`self_contrastive_texts`), each with the role the teacher embeds it under, and (query, positive, hard
negatives) for the initialisation and stage II (:func:`mined_pairs`), negatives mined on cached embeddings past
the top ranks and never a judged-relevant document (CARE §4.1: false negatives in medical retrieval)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

import numpy as np

from medadapt.curation.fast_mining import mine_from_embeddings
from medadapt.curation.mining_config import MiningConfig
from medadapt.errors import DataError

__all__ = ["TrainPair", "corpus_sentences", "labelled_pairs", "mine_hard_negatives", "mined_pairs",
           "self_contrastive_texts"]


@dataclass
class TrainPair:
    """A labelled item: query text, index of its positive and of its hard negatives in ``doc_ids``."""

    query: str
    positive: int
    negatives: list[int] = field(default_factory=list)


_SENTENCE_END = re.compile(r"(?<=[.!?;。！？；])\s*(?=\S)")


def _join(left: str) -> str:
    return "" if left[-1] in "。！？；" else " "  # CJK text has no spaces between sentences


def corpus_sentences(text: str, min_chars: int = 20) -> list[str]:
    """The sentences of a document (split after ``. ! ? ;`` and their CJK forms), whitespace-normalised;
    pieces shorter than ``min_chars`` are joined to the next. A rule split keeps nltk / spaCy out of the
    dependencies.

    Example:
        >>> corpus_sentences("Gout is a form of arthritis. It hurts. Treatment includes NSAIDs and rest.")
        ['Gout is a form of arthritis.', 'It hurts. Treatment includes NSAIDs and rest.']"""
    out: list[str] = []
    carry = ""
    for piece in _SENTENCE_END.split(text):
        piece = " ".join(piece.split())
        if not piece:
            continue
        carry = f"{carry}{_join(carry)}{piece}" if carry else piece
        if len(carry) >= min_chars:
            out.append(carry)
            carry = ""
    if carry:
        if out:
            out[-1] = f"{out[-1]}{_join(out[-1])}{carry}"
        else:
            out.append(carry)
    return out


def self_contrastive_texts(data, query_splits: list[str], include_corpus: bool = True,
                           max_texts: int | None = None, seed: int = 0,
                           max_corpus_texts: int | None = None,
                           corpus_units: str = "documents") -> list[tuple[str, str]]:
    """``[(text, teacher_role)]``: the distinct queries of ``query_splits`` (``"query"``) and,
    with ``include_corpus``, the corpus documents (``"document"``; a random ``max_corpus_texts`` when set) or their
    distinct sentences (``corpus_units="sentences"``, role ``"query"``); shuffled, capped at ``max_texts``."""
    if corpus_units not in ("documents", "sentences"):
        raise DataError(f"corpus_units {corpus_units!r}: choose 'documents' or 'sentences'")
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    for split in query_splits:
        for text in data.split_queries(split).values():
            if text not in seen:
                seen.add(text)
                items.append((text, "query"))
    rng = random.Random(seed)
    if include_corpus:
        docs = data.doc_texts() if corpus_units == "documents" else list(data.corpus.values())
        if max_corpus_texts is not None and max_corpus_texts < len(docs):
            docs = rng.sample(docs, max_corpus_texts)
        if corpus_units == "documents":
            items.extend((text, "document") for text in docs)
        else:
            for doc in docs:
                for sentence in corpus_sentences(doc["text"]):
                    if sentence not in seen:
                        seen.add(sentence)
                        items.append((sentence, "query"))
    if not items:
        raise DataError("no texts for self-contrastive alignment (empty splits and no corpus)")
    rng.shuffle(items)
    return items[:max_texts] if max_texts else items


def labelled_pairs(data, split: str, max_queries: int | None = None, seed: int = 0) -> list[TrainPair]:
    """One :class:`TrainPair` per (query, relevant document) in ``split`` (grade > 0), no negatives yet."""
    position = {d: i for i, d in enumerate(data.doc_ids)}
    qids = list(data.qrels[split]) if split in data.qrels else []
    if not qids:
        raise DataError(f"split {split!r} has no judged queries")
    if max_queries:
        qids = sorted(random.Random(seed).sample(qids, min(max_queries, len(qids))), key=qids.index)
    pairs = []
    for qid in qids:
        for did, grade in data.qrels[split][qid].items():
            if grade > 0 and did in position:
                pairs.append(TrainPair(data.queries[qid], position[did]))
    return pairs


def mine_hard_negatives(pairs: list[TrainPair], query_emb: np.ndarray, doc_emb: np.ndarray, count: int,
                        skip_top: int = 0, depth: int = 50, exclude: list[set[int]] | None = None) -> None:
    """Fill ``pair.negatives`` in place with ``count`` documents ranked after the first
    ``skip_top`` non-relevant ones (cosine of ``query_emb[i]`` to ``doc_emb``), never in ``exclude[i]`` (default
    the pair's positive); padded by repeating on a tiny corpus. The one embedding miner
    (:func:`medadapt.curation.mine_from_embeddings`); ``depth`` is kept for compatibility."""
    if count <= 0:
        return
    banned = [set(exclude[i]) if exclude is not None else {pair.positive} for i, pair in enumerate(pairs)]
    config = MiningConfig(window=(skip_top + 1, skip_top + count), num_negatives=count, margin=None,
                          absolute_margin=None, text_dup_threshold=None, embedding_dup_threshold=None)
    mined = mine_from_embeddings(query_emb, doc_emb, banned, config, count_positives=False, pick="best")
    n_docs = len(doc_emb)
    for pair, chosen, ban in zip(pairs, mined, banned):
        if not chosen:  # fewer than skip_top + 1 non-relevant documents: the first ones by index
            chosen = [j for j in range(n_docs) if j not in ban][:count]
        if not chosen:
            raise DataError("no document is left to be a negative (every document is relevant to a query)")
        while len(chosen) < count:
            chosen.append(chosen[len(chosen) % len(chosen)])
        pair.negatives = chosen


def mined_pairs(data, split: str, max_queries: int | None, count: int, skip_top: int, depth: int, document,
                cache, batch_size: int = 64, seed: int = 0, query_encoder=None) -> list[TrainPair]:
    """:func:`labelled_pairs` of ``split`` with ``count`` hard negatives each, mined by ``document`` on
    embeddings from ``cache``, excluding every document judged relevant to the query; ``query_encoder`` (default
    ``document``) encodes the queries instead."""
    pairs = labelled_pairs(data, split, max_queries=max_queries, seed=seed)
    if count:
        position = {d: i for i, d in enumerate(data.doc_ids)}
        qid_of = {data.queries[q]: q for q in data.qrels[split]}
        exclude = [{position[d] for d, g in data.qrels[split][qid_of[p.query]].items()
                    if g > 0 and d in position} for p in pairs]
        q_emb = cache.encode(query_encoder if query_encoder is not None else document, [p.query for p in pairs],
                             role="query", batch_size=batch_size, show_progress=False)
        d_emb = cache.encode(document, data.doc_texts(), role="document", batch_size=batch_size,
                             show_progress=False)
        mine_hard_negatives(pairs, q_emb, d_emb, count, skip_top=skip_top, depth=depth, exclude=exclude)
    return pairs
