"""Sharded dense builds (medadapt.retrieval.sharding): every shard layout merges into an index that finds what
one index over the whole corpus finds, and a shard file that differs from its checksum is refused."""

from __future__ import annotations

import numpy as np
import pytest

from medadapt.errors import MedAdaptError
from medadapt.retrieval.config import DenseConfig
from medadapt.retrieval.dense import DenseIndex
from medadapt.retrieval.sharding import build_shard, merge_shards, train_shard_template


def _vectors(n=300, d=16, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


@pytest.mark.parametrize("factory, ondisk", [("Flat", False), ("IVF4,Flat", False), ("IVF4,Flat", True),
                                             ("HNSW16", False)])
def test_merged_shards_search_like_one_index(tmp_path, factory, ondisk):
    x = _vectors()
    config = DenseConfig(factory=factory, nprobe=4, ef_search=200, use_gpu=False)
    template = train_shard_template(x, config, tmp_path / "template.faiss")
    parts = [build_shard(template, x[a:b], a, tmp_path / f"shard{a}.faiss") for a, b in ((0, 100), (100, 300))]
    merged = merge_shards(parts, config, ondisk=tmp_path / "lists.ivfdata" if ondisk else None)
    whole = DenseIndex.build(x, config)
    assert merged.ntotal == whole.ntotal == len(x)
    _, got = merged.search(x[:20], 5)
    _, want = whole.search(x[:20], 5)
    assert (got[:, 0] == np.arange(20)).all()  # each vector finds itself at its global position
    assert np.mean([len(set(g) & set(w)) / 5 for g, w in zip(got, want)]) >= 0.9


def test_a_modified_shard_is_refused(tmp_path):
    x = _vectors()
    config = DenseConfig(factory="Flat", use_gpu=False)
    template = train_shard_template(x, config, tmp_path / "template.faiss")
    shard = build_shard(template, x[:50], 0, tmp_path / "shard.faiss")
    with open(shard, "ab") as f:
        f.write(b"x")
    with pytest.raises(MedAdaptError, match="differs from shard.faiss.sha256"):
        merge_shards([shard], config)
