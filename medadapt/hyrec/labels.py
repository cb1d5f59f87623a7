"""Labelling tool for the semantic union (HyReC §4.1.1): word segmentation aligned to tokenizer offsets.

Steps (as in the paper): (1) segment the text into words and record each word's character span; (2)
tokenise it with offsets (``return_offsets_mapping``); (3) give each token the label of its position in
the word that contains its first character: ``S`` (0) for a word made of one token, else ``B`` (1), ``M``
(2) ... ``M``, ``E`` (3). Special tokens and padding get :data:`IGNORE` (-100, skipped by the loss).

Segmentation:

* **Chinese** (``language="zh"``): jieba's precise mode (needs the ``[zh]`` extra), after the regular
  expressions below have claimed their spans, so ``500mg`` or ``COVID-19`` is one word even where jieba
  would split it.
* **English and other space-delimited languages** (``"en"``): the same regular expressions, then runs of
  word characters; every other non-blank character (punctuation) is a word of its own. A word split into
  several WordPiece / BPE pieces is then ``B .. E``.

Regular expressions (in priority order): identifiers with a hyphen or dotted version (``COVID-19``,
``IL-6``, ``v2.1``, ``H1N1``), quantities and doses (``500mg``, ``2.5 ml``, ``10%``, ``37.5℃``,
``5毫克``), numbers (``3.14``, ``1,000``).

Hand-written: jieba and the tokenizers give spans, but nothing aligns the two into BMES labels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from medadapt.errors import ConfigError, MedAdaptError

__all__ = ["S", "B", "M", "E", "IGNORE", "LABEL_NAMES", "UnionLabeler", "align_labels", "segment"]

S, B, M, E = 0, 1, 2, 3
IGNORE = -100
LABEL_NAMES = ("S", "B", "M", "E")

_UNITS = (
    r"mg|mcg|µg|μg|ug|ng|g|kg|ml|mL|l|L|dl|dL|mmol/L|mmol|mol|IU|iu|U|mmHg|cm|mm|km|m|kcal|cal|h|hrs?|min|s|"
    r"bpm|%|‰|℃|°C|°F|毫克|微克|克|千克|公斤|斤|毫升|升|片|粒|支|袋|次|天|日|周|月|年|岁|度|厘米|毫米|米|小时|分钟|秒"
)
_L, _R = r"(?<![A-Za-z0-9])", r"(?![A-Za-z0-9])"  # ASCII word boundaries (CJK characters count as \w)
#: (name, pattern) in priority order; the first alternative matching at a position wins.
PATTERNS: tuple[tuple[str, str], ...] = (
    ("version", rf"{_L}[vV]\d+(?:\.\d+)+{_R}"),
    ("identifier", rf"{_L}[A-Za-z]+[0-9]*(?:-[A-Za-z0-9]+)+{_R}|{_L}[A-Za-z]+\d+[A-Za-z]+\d*{_R}"),
    ("quantity", rf"\d+(?:[.,]\d+)*\s?(?:{_UNITS})(?![A-Za-z])"),
    ("number", r"\d+(?:[.,]\d+)*"),
)
_REGEX = re.compile("|".join(f"(?P<{name}>{p})" for name, p in PATTERNS))
_WORD = re.compile(r"\w+|[^\w\s]", re.UNICODE)

Span = tuple[int, int]


def _regex_spans(text: str) -> list[Span]:
    return [m.span() for m in _REGEX.finditer(text)]


def _gaps(text: str, fixed: list[Span]) -> list[Span]:
    out, pos = [], 0
    for a, b in fixed:
        if a > pos:
            out.append((pos, a))
        pos = b
    if pos < len(text):
        out.append((pos, len(text)))
    return out


def segment(text: str, language: Literal["zh", "en"] = "zh") -> list[Span]:
    """Word character spans of ``text`` (sorted, non-overlapping, blanks excluded)."""
    fixed = _regex_spans(text)
    spans = list(fixed)
    if language == "zh":
        try:
            import jieba
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise MedAdaptError("Chinese union labels need jieba: pip install 'medadapt[zh]'") from exc
        jieba.setLogLevel(60)
        for a, b in _gaps(text, fixed):
            pos = a
            for word in jieba.cut(text[a:b], HMM=True):
                end = pos + len(word)
                if word.strip():
                    # jieba keeps runs of latin letters + spaces together in some versions: split on blanks
                    for m in re.finditer(r"\S+", word):
                        spans.append((pos + m.start(), pos + m.end()))
                pos = end
    elif language == "en":
        for a, b in _gaps(text, fixed):
            spans.extend((a + m.start(), a + m.end()) for m in _WORD.finditer(text[a:b]))
    else:
        raise ConfigError(f"union labelling language must be 'zh' or 'en', got {language!r}")
    return sorted(spans)


def align_labels(words: Sequence[Span], offsets: Sequence[Span]) -> list[int]:
    """BMES label of each token given word spans and token character offsets.

    A token with an empty span (``(0, 0)``: special tokens, padding) gets :data:`IGNORE`. A token belongs to
    the word containing its first non-blank character; a token outside every word is ``S``.
    """
    owner: dict[int, int] = {}
    for w, (a, b) in enumerate(words):
        for c in range(a, b):
            owner[c] = w
    token_word: list[int | None] = []
    for a, b in offsets:
        if b <= a:
            token_word.append(None)
            continue
        w = next((owner[c] for c in range(a, b) if c in owner), None)
        token_word.append(-1 - len(token_word) if w is None else w)  # unique id: its own single-token word
    labels: list[int] = []
    n = len(offsets)
    for i, w in enumerate(token_word):
        if w is None:
            labels.append(IGNORE)
            continue
        first = i == 0 or token_word[i - 1] != w
        last = i == n - 1 or token_word[i + 1] != w
        labels.append(S if first and last else B if first else E if last else M)
    return labels


class UnionLabeler:
    """BMES union labels for a tokenizer (any fast HF tokenizer with offsets).

    Example::

        lab = UnionLabeler(model.tokenizer, language="zh")
        enc = lab("高血压患者每天服用500mg", max_length=64)   # enc["input_ids"], enc["union_labels"]
    """

    def __init__(self, tokenizer, language: Literal["zh", "en"] = "zh"):
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError("union labelling needs a fast tokenizer (offset mappings)")
        if language not in ("zh", "en"):
            raise ConfigError(f"union labelling language must be 'zh' or 'en', got {language!r}")
        self.tokenizer = tokenizer
        self.language = language

    def labels(self, text: str, offsets: Sequence[Span]) -> list[int]:
        return align_labels(segment(text, self.language), offsets)

    def __call__(self, text: str, max_length: int | None = None) -> dict[str, list[int]]:
        enc = self.tokenizer(text, truncation=max_length is not None, max_length=max_length,
                             return_offsets_mapping=True)
        return {"input_ids": list(enc["input_ids"]), "union_labels": self.labels(text, enc["offset_mapping"])}

    def batch(self, texts: Sequence[str], offsets: Sequence[Sequence[Span]]) -> list[list[int]]:
        """Labels for already tokenised texts (``offsets[i]`` of ``texts[i]``, padding included)."""
        return [self.labels(t, [tuple(o) for o in off]) for t, off in zip(texts, offsets)]
