"""Text to terms for BM25, the token lists of ``bm25s.tokenize(..., stopwords="en", stemmer=english)``
(Chinese: jieba's search mode), without bm25s' vocabulary objects and with per-word stem memoisation."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence

from medadapt.errors import MedAdaptError

TOKEN_PATTERN = re.compile(r"(?u)\b\w\w+\b")
#: CJK ideographs: Extension A, the Unified and the Compatibility block (the one CJK pattern of medadapt).
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

#: The English stopwords of Lucene's ``EnglishAnalyzer`` (also bm25s' ``"en"`` list).
ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with".split()
)


def detect_language(texts: Sequence[str], sample: int = 200) -> str:
    """``"zh"`` when more than 20 % of the characters of the first ``sample`` texts are CJK, else ``"en"``."""
    joined = "".join(list(texts[:sample]))
    return "zh" if len(CJK.findall(joined)) / max(len(joined), 1) > 0.2 else "en"


def cjk_characters(texts: Sequence[str]) -> list[str]:
    """Sorted distinct CJK ideographs of ``texts``."""
    return sorted({c for t in texts for c in CJK.findall(t)})


class Tokenizer:
    """Texts to lists of terms; ``language`` ``"en"``, ``"zh"`` or ``"none"`` (resolve ``"auto"`` with
    :func:`detect_language`); English ``stopwords`` and Snowball ``stem`` (PyStemmer) apply to ``"en"`` only."""

    def __init__(self, language: str = "en", stopwords: bool = True, stem: bool = True):
        if language not in ("en", "zh", "none"):
            raise MedAdaptError(f"tokenizer language must be 'en', 'zh' or 'none', got {language!r}")
        self.language = language
        self.stopwords = ENGLISH_STOPWORDS if (stopwords and language == "en") else frozenset()
        self._stemmer = None
        self._stem_cache: dict[str, str] = {}
        self._lock = threading.Lock()
        if stem and language == "en":
            try:
                import Stemmer
            except ImportError as exc:
                raise MedAdaptError(
                    "English stemming needs PyStemmer: pip install PyStemmer (or set lexical.stem=false)"
                ) from exc
            self._stemmer = Stemmer.Stemmer("english")
        if language == "zh":
            try:
                import jieba
            except ImportError as exc:
                raise MedAdaptError("Chinese tokenisation needs jieba: pip install 'medadapt[zh]'") from exc
            jieba.setLogLevel(60)
            self._jieba = jieba

    def _stem_all(self, words: list[str]) -> list[str]:
        cache = self._stem_cache
        new = [w for w in set(words) if w not in cache]
        if new:
            with self._lock:  # PyStemmer objects are not thread-safe
                stems = self._stemmer.stemWords(new)
            cache.update(zip(new, stems))
        return [cache[w] for w in words]

    def __call__(self, text: str) -> list[str]:
        if self.language == "zh":
            return [w for w in self._jieba.lcut_for_search(text) if w.strip()]
        words = TOKEN_PATTERN.findall(text.lower())
        if self.stopwords:
            words = [w for w in words if w not in self.stopwords]
        if self._stemmer is not None and words:
            words = self._stem_all(words)
        return words
