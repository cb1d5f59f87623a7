"""medadapt.identity: the JSON key of cache namespaces and the fingerprint of a training run."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from medadapt.identity import json_fingerprint, run_fingerprint


def test_json_fingerprint_keeps_the_cache_namespace_names():
    """Cache folders written before json_fingerprint existed keep their names: same digest as the cache's
    former ``sha256(json.dumps(meta, sort_keys=True))[:32]``, whatever the key order."""
    meta = {"format": 1, "model": "abc", "max_seq_length": 64, "role": "document", "prompt": "passage: ",
            "stored": "backbone_output", "dtype": "float32"}
    old = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
    assert json_fingerprint(meta) == old
    assert json_fingerprint(dict(reversed(list(meta.items())))) == old
    assert json_fingerprint({**meta, "role": "query"}) != old
    assert len(json_fingerprint(meta, 24)) == 24


class _Recipe:
    """What run_fingerprint reads of a recipe: its training identity, its dump and path resolution."""

    def __init__(self, root: Path, data: str, lr: float = 1e-3):
        self.root, self.data, self.lr = root, data, lr

    def training_identity(self) -> dict:
        return {"lr": self.lr}

    def model_dump(self, mode: str, exclude: set) -> dict:
        return {"data": {"path": self.data}, "training": {"lr": self.lr}, "eval": {"path": "ignored"}}

    def resolve(self, value: str) -> Path:
        return self.root / value


def test_run_fingerprint_follows_the_training_identity_and_the_data_files(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"query": "a", "pos": ["b"]}\n')
    first = run_fingerprint(_Recipe(tmp_path, "train.jsonl"))
    assert run_fingerprint(_Recipe(tmp_path, "train.jsonl")) == first  # stable
    assert run_fingerprint(_Recipe(tmp_path, "train.jsonl", lr=2e-3)) != first  # another training identity
    data.write_text('{"query": "a", "pos": ["b", "c"]}\n')  # rebuilt data: another size
    assert run_fingerprint(_Recipe(tmp_path, "train.jsonl")) != first
    stat = data.stat()
    again = run_fingerprint(_Recipe(tmp_path, "train.jsonl"))
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, touched: another run
    assert run_fingerprint(_Recipe(tmp_path, "train.jsonl")) != again
