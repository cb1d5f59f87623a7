"""Rerank lists: JSONL ``{"query": str, "candidates": [{"text": str, "grade": int}, ...]}``.

``grade`` > 0 marks a relevant candidate (graded relevance is used by nDCG).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from medadapt.data.jsonl import MAX_GRADE, field, iter_jsonl
from medadapt.errors import DataError


@dataclass(frozen=True)
class RerankItem:
    query: str
    texts: list[str]
    grades: list[int]


def load_rerank(path: str | Path) -> list[RerankItem]:
    """Read rerank lists; an empty or blank query, an empty candidate list or a bad grade is a
    :class:`DataError` naming the file and the line."""
    path = Path(path)
    items = []
    for n, obj in iter_jsonl(path, "rerank file"):
        query = field(obj, "query", str, path, n)
        if not query.strip():
            raise DataError(f"{path}:{n}: 'query' is empty")
        cands = field(obj, "candidates", list, path, n)
        if not cands:
            raise DataError(f"{path}:{n}: 'candidates' is empty")
        texts, grades = [], []
        for j, c in enumerate(cands):
            if not isinstance(c, dict) or not isinstance(c.get("text"), str):
                raise DataError(f"{path}:{n}: candidate {j} must be an object with a string 'text'")
            g = c.get("grade", 0)
            if isinstance(g, bool) or not isinstance(g, (int, float)):
                raise DataError(f"{path}:{n}: candidate {j} has a non-numeric 'grade'")
            if isinstance(g, float) and not (math.isfinite(g) and g.is_integer()) or g > MAX_GRADE:
                raise DataError(f"{path}:{n}: candidate {j} 'grade' {g!r} is not an integer <= {MAX_GRADE}")
            texts.append(c["text"])
            grades.append(int(g))
        items.append(RerankItem(query, texts, grades))
    if not items:
        raise DataError(f"{path}: no rerank lists")
    return items
