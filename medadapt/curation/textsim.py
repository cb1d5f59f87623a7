"""Text near-duplicates by Jaccard similarity of character n-grams (Chinese and English alike): mining drops
candidates nearly equal to a positive, the false negatives CMedTEB §4.1 warns about.
"""

from __future__ import annotations

import re
from functools import lru_cache

_SPACE_PUNCT = re.compile(r"[\s\W_]+", re.UNICODE)


def normalize_text(text: str) -> str:
    return _SPACE_PUNCT.sub("", text.lower())


@lru_cache(maxsize=200_000)
def shingles(text: str, n: int = 3) -> frozenset[str]:
    """Character ``n``-grams of the normalised text (the whole text if shorter than ``n``)."""
    t = normalize_text(text)
    if len(t) <= n:
        return frozenset([t]) if t else frozenset()
    return frozenset(t[i : i + n] for i in range(len(t) - n + 1))


def jaccard(a: str, b: str, n: int = 3) -> float:
    """Jaccard similarity of the character ``n``-gram sets of ``a`` and ``b`` (1.0 for equal texts)."""
    sa, sb = shingles(a, n), shingles(b, n)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def is_near_duplicate(text: str, others: list[str], threshold: float, n: int = 3) -> bool:
    """True when ``text`` has Jaccard >= ``threshold`` with any of ``others``."""
    return any(jaccard(text, o, n) >= threshold for o in others)
