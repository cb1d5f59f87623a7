"""Diversity-aware dedup (CARE App. B) on constructed near-duplicates, and exactness of the batching."""

from __future__ import annotations

import numpy as np
import pytest

from medadapt.curation import DedupConfig, diversity_dedup


def _unit(v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _near(base, eps, rng):
    return _unit(base + eps * rng.normal(size=base.shape))


def reference(x: np.ndarray, cfg: DedupConfig) -> np.ndarray:
    """One-at-a-time streaming, brute force: the rule as the paper states it."""
    x = _unit(x)
    kept_rows: list[int] = []
    keep = np.zeros(len(x), dtype=bool)
    for i in range(len(x)):
        if i < cfg.seed_size:
            keep[i] = True
        else:
            sims = np.sort(x[kept_rows] @ x[i])[::-1][: cfg.k] if kept_rows else np.array([])
            keep[i] = int((sims > cfg.threshold).sum()) <= cfg.max_neighbors
        if keep[i]:
            kept_rows.append(i)
    return keep


def test_paper_defaults():
    q, d = DedupConfig.for_queries(), DedupConfig.for_documents()
    assert (q.k, q.threshold, q.max_neighbors, q.seed_size) == (5, 0.85, 1, 5000)
    assert (d.k, d.threshold, d.max_neighbors) == (5, 0.78, 1)
    with pytest.raises(ValueError, match="must be < k"):
        DedupConfig(k=2, max_neighbors=2)
    with pytest.raises(ValueError, match="extra"):
        DedupConfig(tau=0.5)


def test_constructed_near_duplicates_m1_and_m0():
    rng = np.random.default_rng(0)
    base = np.eye(16, dtype=np.float32)[:3]  # three orthogonal topics
    items = np.stack([
        base[0], base[1], base[2],            # 0-2 distinct
        _near(base[0], 0.05, rng),            # 3: first near-dup of topic 0 -> kept with m=1
        _near(base[0], 0.05, rng),            # 4: second near-dup (2 neighbours > τ) -> discarded
        _near(base[1], 0.05, rng),            # 5: first near-dup of topic 1 -> kept
        _unit(base[0] + base[1] + base[2]),   # 6: cos ≈ 0.58 with everything -> kept
        _near(base[0], 0.05, rng),            # 7: topic 0 again -> discarded
    ])
    res = diversity_dedup(items, DedupConfig(k=5, threshold=0.85, max_neighbors=1, seed_size=0), show_progress=False)
    assert res.kept.tolist() == [True, True, True, True, False, True, True, False]
    assert res.n_kept == 6 and res.n_discarded == 2 and res.discarded_indices.tolist() == [4, 7]
    assert res.neighbors_above[4] == 2
    strict = diversity_dedup(items, DedupConfig(k=5, threshold=0.85, max_neighbors=0, seed_size=0),
                             show_progress=False)
    assert strict.kept.tolist() == [True, True, True, False, False, False, True, False]
    seeded = diversity_dedup(items, DedupConfig(k=5, threshold=0.85, max_neighbors=0, seed_size=5),
                             show_progress=False)
    assert seeded.kept[:5].all() and seeded.summary()["seed"] == 5  # seeds go in unconditionally
    assert not seeded.kept[5] and not seeded.kept[7]


def test_intra_batch_duplicates_are_caught():
    rng = np.random.default_rng(1)
    x = np.stack([_near(np.eye(8)[0], 0.02, rng) for _ in range(6)])  # one batch, all near-identical
    res = diversity_dedup(x, DedupConfig(k=5, threshold=0.9, max_neighbors=1, seed_size=0, batch_size=64),
                          show_progress=False)
    assert res.kept.tolist() == [True, True, False, False, False, False]


@pytest.mark.parametrize("batch_size", [1, 7, 64, 1000])
def test_batched_equals_one_at_a_time(batch_size):
    rng = np.random.default_rng(2)
    centers = rng.normal(size=(20, 24))
    x = np.concatenate([_near(centers[rng.integers(20)], 0.35, rng)[None] for _ in range(300)]).astype(np.float32)
    cfg = DedupConfig(k=5, threshold=0.8, max_neighbors=1, seed_size=30, batch_size=batch_size)
    res = diversity_dedup(x, cfg, show_progress=False)
    expected = reference(x, cfg)
    assert 0 < expected.sum() < len(x)  # the data really has duplicates
    assert res.kept.tolist() == expected.tolist()


def test_hnsw_index_and_errors():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 16)).astype(np.float32)
    res = diversity_dedup(x, DedupConfig(seed_size=0, index="hnsw", threshold=0.9), show_progress=False)
    assert res.n_kept == 500  # random 16-d vectors are never that close
    with pytest.raises(ValueError, match="2-D"):
        diversity_dedup(np.zeros(5))
    with pytest.raises(ValueError, match="NaN"):
        diversity_dedup(np.full((3, 2), np.nan))
