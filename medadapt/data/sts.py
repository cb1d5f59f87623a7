"""Semantic-textual-similarity pairs: JSONL ``{"sentence1": str, "sentence2": str, "score": float}``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from medadapt.data.jsonl import field, iter_jsonl
from medadapt.errors import DataError


@dataclass(frozen=True)
class StsPair:
    sentence1: str
    sentence2: str
    score: float


def load_sts(path: str | Path) -> list[StsPair]:
    """Read STS pairs; a missing field, a non-numeric or non-finite (NaN, Infinity) score is a
    :class:`DataError` naming the file and the line."""
    path = Path(path)
    pairs = []
    for n, obj in iter_jsonl(path, "STS file"):
        s1 = field(obj, "sentence1", str, path, n)
        s2 = field(obj, "sentence2", str, path, n)
        raw = field(obj, "score", (int, float), path, n)
        score = float(raw) if isinstance(raw, float) or abs(raw) < 2**1000 else math.inf
        if not math.isfinite(score):
            raise DataError(f"{path}:{n}: field 'score' must be a finite number, got {score}")
        pairs.append(StsPair(s1, s2, score))
    if len(pairs) < 2:
        raise DataError(f"{path}: STS evaluation needs at least 2 pairs, found {len(pairs)}")
    return pairs
