"""Training groups in the FlagEmbedding JSONL schema::

    {"query": str, "pos": [str, ...], "neg": [str, ...], "pos_scores": [float]?, "neg_scores": [float]?,
     "prompt": str?}
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field as dc_field
from pathlib import Path

from medadapt.data.jsonl import field, iter_jsonl
from medadapt.errors import DataError


@dataclass
class TrainingGroup:
    query: str
    pos: list[str]
    neg: list[str] = dc_field(default_factory=list)
    pos_scores: list[float] | None = None
    neg_scores: list[float] | None = None
    prompt: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _str_list(obj: dict, key: str, path: Path, lineno: int, required: bool) -> list[str]:
    value = field(obj, key, list, path, lineno, required=required) or []
    if any(not isinstance(v, str) for v in value):
        raise DataError(f"{path}:{lineno}: field {key!r} must be a list of strings")
    return value


def _score_list(obj: dict, key: str, n: int, path: Path, lineno: int) -> list[float] | None:
    value = field(obj, key, list, path, lineno, required=False)
    if value is None:
        return None
    if len(value) != n or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
        raise DataError(f"{path}:{lineno}: field {key!r} must be {n} numbers (one per passage)")
    if any(not math.isfinite(v) if isinstance(v, float) else abs(v) >= 2**1000 for v in value):
        raise DataError(f"{path}:{lineno}: field {key!r} must hold finite numbers")
    return [float(v) for v in value]


def load_training_groups(path: str | Path) -> list[TrainingGroup]:
    """Load and validate a FlagEmbedding-style JSONL file of training groups."""
    path = Path(path)
    groups = []
    for lineno, obj in iter_jsonl(path, "training file"):
        query = field(obj, "query", str, path, lineno)
        if not query.strip():
            raise DataError(f"{path}:{lineno}: field 'query' is empty")
        pos = _str_list(obj, "pos", path, lineno, required=True)
        if not pos:
            raise DataError(f"{path}:{lineno}: field 'pos' must hold at least one passage")
        neg = _str_list(obj, "neg", path, lineno, required=False)
        groups.append(
            TrainingGroup(
                query=query,
                pos=pos,
                neg=neg,
                pos_scores=_score_list(obj, "pos_scores", len(pos), path, lineno),
                neg_scores=_score_list(obj, "neg_scores", len(neg), path, lineno),
                prompt=field(obj, "prompt", str, path, lineno, required=False),
            )
        )
    if not groups:
        raise DataError(f"{path}: no training groups")
    return groups
