"""Atomic JSONL output of curated data (temp file + ``os.replace`` via :func:`medadapt.io.atomic_open`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from medadapt.io import atomic_open


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write ``rows`` as UTF-8 JSON lines atomically; returns their number."""
    n = 0
    with atomic_open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n


def write_training_groups(path: str | Path, groups) -> int:
    """Write FlagEmbedding training groups (``{query, pos, neg, pos_scores?, neg_scores?, prompt?}``)."""
    return write_jsonl(path, (g.to_dict() for g in groups))
