"""HyReC union labelling: segmentation (jieba + regex, English words) aligned to tokenizer offsets."""

from __future__ import annotations

import pytest

from medadapt.errors import ConfigError
from medadapt.hyrec.labels import B, E, IGNORE, M, S, UnionLabeler, align_labels, segment


def words(text, language):
    return [text[a:b] for a, b in segment(text, language)]


def test_chinese_segmentation_keeps_doses_and_identifiers_whole():
    pytest.importorskip("jieba")
    text = "高血压患者每天服用500mg阿司匹林，COVID-19和IL-6 v2.1"
    got = words(text, "zh")
    assert got[:3] == ["高血压", "患者", "每天"]
    for w in ("500mg", "COVID-19", "IL-6", "v2.1", "，"):
        assert w in got


@pytest.mark.parametrize("text, expected", [
    ("Take 2.5 ml of acetaminophen", ["Take", "2.5 ml", "of", "acetaminophen"]),
    ("10% of COVID-19 cases, v2.1", ["10%", "of", "COVID-19", "cases", ",", "v2.1"]),
    ("IL-6 rose to 3,000 units", ["IL-6", "rose", "to", "3,000", "units"]),
])
def test_english_segmentation_with_numbers_and_doses(text, expected):
    assert words(text, "en") == expected


def test_align_labels_on_hand_made_chinese_offsets():
    pytest.importorskip("jieba")
    text = "高血压患者服用500mg"
    # one token per character, "500mg" as two pieces, [CLS] / [SEP] as empty spans
    offsets = [(0, 0)] + [(i, i + 1) for i in range(7)] + [(7, 10), (10, 12), (0, 0)]
    labels = align_labels(segment(text, "zh"), offsets)
    assert labels == [IGNORE, B, M, E, B, E, B, E, B, E, IGNORE]


def test_align_labels_single_token_words_are_s_and_padding_ignored():
    text = "gout attack 500mg"
    offsets = [(0, 0), (0, 4), (5, 11), (12, 15), (15, 17), (0, 0), (0, 0)]
    assert align_labels(segment(text, "en"), offsets) == [IGNORE, S, S, B, E, IGNORE, IGNORE]


def test_align_labels_long_word_uses_middle_labels():
    offsets = [(0, 3), (3, 6), (6, 9), (9, 13)]
    assert align_labels([(0, 13)], offsets) == [B, M, M, E]


def test_labeler_on_wordpiece_tokenizer(tiny_bert):
    tok = tiny_bert.tokenizer
    lab = UnionLabeler(tok, "en")
    text = "diabetes insulin 500mg glucose"
    enc = lab(text)
    pieces = tok.convert_ids_to_tokens(enc["input_ids"])
    labels = enc["union_labels"]
    assert labels[0] == IGNORE and labels[-1] == IGNORE
    # every word made of several pieces reads B M* E, every one-piece word S
    enc_off = tok(text, return_offsets_mapping=True)["offset_mapping"]
    spans = segment(text, "en")
    for a, b in spans:
        idx = [i for i, (s, e) in enumerate(enc_off) if e > s and a <= s < b]
        got = [labels[i] for i in idx]
        want = [S] if len(idx) == 1 else [B] + [M] * (len(idx) - 2) + [E]
        assert got == want, (text[a:b], [pieces[i] for i in idx], got)


def test_labeler_rejects_unknown_language(tiny_bert):
    with pytest.raises(ConfigError, match="zh"):
        UnionLabeler(tiny_bert.tokenizer, "fr")
    with pytest.raises(ConfigError):
        segment("x", "fr")
