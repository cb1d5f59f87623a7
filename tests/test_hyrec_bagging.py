"""HyReC bagging (eq. 7-8), stable word ids and the Normalisation Module."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from medadapt.hyrec.bagging import WordVocab, bag_words, group_words, sparse_from_tokens
from medadapt.hyrec.labels import B, E, M, S
from medadapt.hyrec.normalize import hybrid_score, normalize_dense, normalize_sparse, normalize_term_weights


def onehot(labels, p=0.7):
    probs = np.full((len(labels), 4), (1 - p) / 3, dtype=np.float32)
    for i, lab in enumerate(labels):
        probs[i, lab] = p
    return probs


def test_group_words_and_repairs():
    assert group_words([S, B, M, E, S, B, E]) == [[0], [1, 2, 3], [4], [5, 6]]
    assert group_words([M, E, S]) == [[0, 1], [2]]          # M without B opens a word
    assert group_words([B, M, B, E]) == [[0, 1], [2, 3]]     # B while open closes the open word
    assert group_words([B, M]) == [[0, 1]]                   # unterminated word at the end
    with pytest.raises(ValueError):
        group_words([7])


def test_bag_words_takes_max_weight_and_max_union():
    probs = onehot([S, B, M, E])
    probs[2, M] = 0.9  # the most confident token of the word
    words = bag_words([10, 11, 12, 13], [0.5, 0.2, 1.5, 0.4], probs)
    assert [w.token_ids for w in words] == [(10,), (11, 12, 13)]
    assert words[1].weight == pytest.approx(1.5)   # eq. 8: max over the word's tokens
    assert words[1].union == pytest.approx(0.9)    # eq. 7: max over the word's tokens
    assert words[0].weight == pytest.approx(0.5)


def test_word_ids_are_stable_bounded_and_decodable():
    vocab = WordVocab(vocab_size=100, n_buckets=50)
    a = vocab.add([5, 6, 7], "abc")
    assert 100 <= a < vocab.n_terms == 150
    assert vocab.word_id([5, 6, 7]) == a == WordVocab(100, 50).word_id([5, 6, 7])
    wide = WordVocab(vocab_size=100, n_buckets=2**40)  # order matters (a hash of the sequence, not of the set);
    assert wide.word_id([7, 6, 5]) != wide.word_id([5, 6, 7])  # with 50 buckets these two collide, as allowed
    assert vocab.word_id([42]) == 42              # a single token keeps its own id
    assert vocab.decode(a) == "abc" and vocab.decode(3, lambda i: f"tok{i}") == "tok3"
    again = WordVocab.from_json(vocab.to_json())
    assert again.strings == vocab.strings and again.n_terms == vocab.n_terms


def test_sparse_vector_with_and_without_subterms():
    vocab = WordVocab(100, 1000)
    ids, weights = [1, 2, 3, 2], [0.1, 0.8, 0.3, 0.5]
    probs = onehot([S, B, E, S])
    v = sparse_from_tokens(ids, weights, probs, vocab, keep_subterms=True)
    word = vocab.word_id([2, 3])
    assert v == {1: pytest.approx(0.1), 2: pytest.approx(0.8), 3: pytest.approx(0.3), word: pytest.approx(0.8)}
    v2 = sparse_from_tokens(ids, weights, probs, vocab, keep_subterms=False)
    # token 2 still appears as a single word at position 3 (weight 0.5); token 3 only inside the word
    assert v2 == {1: pytest.approx(0.1), 2: pytest.approx(0.5), word: pytest.approx(0.8)}
    assert sparse_from_tokens(ids, weights, None, vocab) == {1: pytest.approx(0.1), 2: pytest.approx(0.8),
                                                             3: pytest.approx(0.3)}
    assert word not in sparse_from_tokens(ids, weights, probs, vocab, min_union=0.9)
    assert sparse_from_tokens([4], [0.0], onehot([S]), vocab) == {}  # zero weights are dropped


def test_normalisation_module():
    w = torch.tensor([[3.0, 4.0, 9.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    n = normalize_term_weights(w, mask)
    assert torch.allclose(n[0], torch.tensor([0.6, 0.8, 0.0]))
    assert torch.allclose(n[1], torch.tensor([1.0, 0.0, 0.0]))
    d = normalize_dense(torch.tensor([[3.0, 4.0]]))
    assert torch.allclose(d, torch.tensor([[0.6, 0.8]]))
    s = normalize_sparse({1: 3.0, 7: 4.0})
    assert s == {1: pytest.approx(0.6), 7: pytest.approx(0.8)}
    assert math.isclose(sum(v * v for v in s.values()), 1.0)
    assert normalize_sparse({1: 0.0}) == {}
    assert hybrid_score(0.5, 0.25) == 0.75 and hybrid_score(0.5, 0.25, dense_weight=2.0) == 1.0
