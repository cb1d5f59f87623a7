"""Semantic-textual-similarity pairs: JSONL ``{"sentence1": str, "sentence2": str, "score": float}``."""

from __future__ import annotations

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
    path = Path(path)
    pairs = [
        StsPair(
            field(obj, "sentence1", str, path, n),
            field(obj, "sentence2", str, path, n),
            float(field(obj, "score", (int, float), path, n)),
        )
        for n, obj in iter_jsonl(path, "STS file")
    ]
    if len(pairs) < 2:
        raise DataError(f"{path}: STS evaluation needs at least 2 pairs, found {len(pairs)}")
    return pairs
