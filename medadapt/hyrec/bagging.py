"""Bagging module (HyReC §3.1.4, eq. 7-8): merge tokens into words using the predicted union labels.

Tokens are grouped by their arg-max ``{S, B, M, E}`` labels (eq. 4): ``B`` opens a word, ``M`` continues
it, ``E`` closes it, ``S`` is a one-token word; an ``M`` / ``E`` with no open word opens one, a ``B`` / ``S``
closes an open word first. A multi-token word gets ``U_word = max U_i`` (eq. 7) and ``W_word = max W_i``
(eq. 8), and a stable term id: a BLAKE2b hash of its token ids in ``[vocab_size, vocab_size + n_buckets)``,
the same in every text, process and run (:class:`WordVocab` keeps the first string seen for ``decode``).
Hand-written: no library implements HyReC's union-of-terms bagging.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from medadapt.errors import ConfigError
from medadapt.hyrec.labels import B, E, M, S

__all__ = ["Word", "WordVocab", "group_words", "bag_words", "sparse_from_tokens"]


@dataclass(frozen=True)
class Word:
    """A bagged word: token positions, token ids, union probability (eq. 7) and weight (eq. 8)."""

    positions: tuple[int, ...]
    token_ids: tuple[int, ...]
    union: float
    weight: float


def group_words(labels: Sequence[int]) -> list[list[int]]:
    """Token-position groups from BMES labels (see the module docstring for the repair rules).

    >>> group_words([0, 1, 2, 3, 0, 1, 3])
    [[0], [1, 2, 3], [4], [5, 6]]
    """
    words: list[list[int]] = []
    open_word: list[int] | None = None
    for i, lab in enumerate(labels):
        lab = int(lab)
        if lab in (S, B) and open_word is not None:
            words.append(open_word)
            open_word = None
        if lab == S:
            words.append([i])
        elif lab == B:
            open_word = [i]
        elif lab in (M, E):
            if open_word is None:
                open_word = []
            open_word.append(i)
            if lab == E:
                words.append(open_word)
                open_word = None
        else:
            raise ValueError(f"union label must be 0..3 (S, B, M, E), got {lab}")
    if open_word is not None:
        words.append(open_word)
    return words


def bag_words(token_ids: Sequence[int], weights: Sequence[float], union_probs: np.ndarray) -> list[Word]:
    """Words of one text (special tokens and padding already removed).

    Args:
        token_ids: ``T`` token ids.
        weights: ``T`` token weights ``W_i``.
        union_probs: ``T × 4`` union probabilities ``U_i``.
    """
    union_probs = np.asarray(union_probs, dtype=np.float32)
    if not (len(token_ids) == len(weights) == len(union_probs)):
        raise ValueError("token_ids, weights and union_probs must have the same length")
    labels = union_probs.argmax(axis=1) if len(union_probs) else np.zeros(0, dtype=np.int64)
    out = []
    for pos in group_words(labels.tolist()):
        out.append(Word(
            positions=tuple(pos),
            token_ids=tuple(int(token_ids[i]) for i in pos),
            union=float(max(union_probs[i, labels[i]] for i in pos)),
            weight=float(max(weights[i] for i in pos)),
        ))
    return out


class WordVocab:
    """Stable ids for multi-token words, above the tokenizer vocabulary, with their strings for ``decode``.

    Args:
        vocab_size: tokenizer vocabulary size (ids ``0 .. vocab_size-1`` are tokenizer terms).
        n_buckets: how many word ids exist above it.
    """

    def __init__(self, vocab_size: int, n_buckets: int = 2**20, strings: dict[int, str] | None = None):
        if vocab_size < 1 or n_buckets < 1:
            raise ConfigError("vocab_size and n_buckets must be >= 1")
        self.vocab_size = int(vocab_size)
        self.n_buckets = int(n_buckets)
        self.strings: dict[int, str] = dict(strings or {})

    @property
    def n_terms(self) -> int:
        return self.vocab_size + self.n_buckets

    def word_id(self, token_ids: Sequence[int]) -> int:
        """``vocab_size + blake2b(token ids) mod n_buckets``; a single token keeps its own id."""
        if len(token_ids) == 1:
            return int(token_ids[0])
        data = np.asarray(token_ids, dtype="<i8").tobytes()
        h = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
        return self.vocab_size + h % self.n_buckets

    def add(self, token_ids: Sequence[int], text: str | Callable[[], str]) -> int:
        """The word's id, remembering its string the first time (``text`` may be a function, then called
        only for a word not seen before: decoding every word of every document is the slow part)."""
        wid = self.word_id(token_ids)
        if wid >= self.vocab_size and wid not in self.strings:
            self.strings[wid] = text() if callable(text) else text
        return wid

    def decode(self, term_id: int, token_decoder: Callable[[int], str] | None = None) -> str:
        """The string of a term id: a learned word's text, or the tokenizer token via ``token_decoder``."""
        if term_id >= self.vocab_size:
            return self.strings.get(int(term_id), f"<word:{term_id}>")
        return token_decoder(int(term_id)) if token_decoder else str(term_id)

    def to_json(self) -> dict:
        return {"vocab_size": self.vocab_size, "n_buckets": self.n_buckets,
                "strings": {str(k): v for k, v in sorted(self.strings.items())}}

    @classmethod
    def from_json(cls, obj: dict) -> WordVocab:
        strings = {int(k): v for k, v in obj.get("strings", {}).items()}
        return cls(obj["vocab_size"], obj["n_buckets"], strings)


def sparse_from_tokens(token_ids: Sequence[int], weights: Sequence[float], union_probs: np.ndarray | None,
                       vocab: WordVocab, *, keep_subterms: bool = True, min_union: float = 0.0,
                       word_text: Callable[[Sequence[int]], str] | None = None) -> dict[int, float]:
    """One text's sparse vector ``{term_id: weight}``.

    Token terms take the max weight over their occurrences (as TILDEv2 / BGE-M3 do). With ``union_probs``,
    every multi-token word whose union probability is at least ``min_union`` adds its word id with weight
    ``W_word`` (eq. 8); ``keep_subterms`` keeps its tokens as terms too (partial matches), otherwise they
    are dropped. Zero weights are left out.
    """
    out: dict[int, float] = {}

    def put(term: int, w: float) -> None:
        if w > 0 and w > out.get(term, 0.0):
            out[term] = float(w)

    covered: set[int] = set()
    if union_probs is not None:
        for word in bag_words(token_ids, weights, union_probs):
            if len(word.token_ids) < 2 or word.union < min_union:
                continue
            ids = word.token_ids
            put(vocab.add(ids, (lambda ids=ids: word_text(ids)) if word_text else ""), word.weight)
            if not keep_subterms:
                covered.update(word.positions)
    for i, (t, w) in enumerate(zip(token_ids, weights)):
        if i not in covered:
            put(int(t), float(w))
    return out
