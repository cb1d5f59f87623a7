"""Diversity-aware deduplication (CARE / CMedTEB §4.1): a streaming FAISS index seeded with ``seed_size``
items; a candidate is discarded when more than ``max_neighbors`` of its top-``k`` neighbours are above
``threshold``. Batched, equal to one at a time with a flat index (``hnsw`` trades exactness for speed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from medadapt.cache import EmbeddingCache
from medadapt.curation.fast_mining import as_matrix
from medadapt.eval.search import normalize_rows
from medadapt.progress import progress

DEDUP_CONFIG_VERSION = 1


class DedupConfig(BaseModel):
    """Settings of :func:`diversity_dedup` (paper names: ``k``, ``τ`` = threshold, ``m`` = max_neighbors)."""

    model_config = ConfigDict(extra="forbid")

    version: int = DEDUP_CONFIG_VERSION
    k: int = Field(5, ge=1)
    threshold: float = Field(0.85, gt=-1.0, le=1.0)
    max_neighbors: int = Field(1, ge=0)
    seed_size: int = Field(5000, ge=0)
    batch_size: int = Field(2048, ge=1)
    index: Literal["flat", "hnsw"] = "flat"
    hnsw_m: int = Field(32, ge=4)

    @model_validator(mode="after")
    def _check(self) -> DedupConfig:
        if self.max_neighbors >= self.k:
            raise ValueError(f"max_neighbors ({self.max_neighbors}) must be < k ({self.k}), "
                             "otherwise nothing can be discarded")
        return self

    @classmethod
    def for_queries(cls, **overrides) -> DedupConfig:
        """Paper defaults for queries: k=5, τ=0.85, m=1, 5,000 seed items."""
        return cls(**{"k": 5, "threshold": 0.85, "max_neighbors": 1, "seed_size": 5000, **overrides})

    @classmethod
    def for_documents(cls, **overrides) -> DedupConfig:
        """Paper defaults for documents: k=5, τ=0.78, m=1, 5,000 seed items."""
        return cls(**{"k": 5, "threshold": 0.78, "max_neighbors": 1, "seed_size": 5000, **overrides})


@dataclass
class DedupResult:
    """``kept``: a mask over the input; ``neighbors_above``: per item, its top-``k`` neighbours above τ when
    it was checked (``-1`` for seed items)."""

    kept: np.ndarray
    neighbors_above: np.ndarray
    seed_size: int

    @property
    def kept_indices(self) -> np.ndarray:
        return np.nonzero(self.kept)[0]

    @property
    def discarded_indices(self) -> np.ndarray:
        return np.nonzero(~self.kept)[0]

    @property
    def n_kept(self) -> int:
        return int(self.kept.sum())

    @property
    def n_discarded(self) -> int:
        return int((~self.kept).sum())

    def summary(self) -> dict:
        n = len(self.kept)
        return {"items": n, "seed": self.seed_size, "kept": self.n_kept, "discarded": self.n_discarded,
                "kept_fraction": round(self.n_kept / n, 4) if n else 0.0}


def _new_index(dim: int, config: DedupConfig):
    import faiss

    if config.index == "hnsw":
        index = faiss.IndexHNSWFlat(dim, config.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = max(64, 4 * config.k)
        return index
    return faiss.IndexFlatIP(dim)


def diversity_dedup(embeddings: np.ndarray, config: DedupConfig | None = None,
                    show_progress: bool = True) -> DedupResult:
    """The streaming diversity filter over ``embeddings`` in row order; the first ``seed_size`` rows seed
    the index unconditionally (shuffle first for a random seed set)."""
    config = config or DedupConfig()
    x = np.ascontiguousarray(normalize_rows(as_matrix(embeddings, "embeddings")))
    n = len(x)
    kept = np.zeros(n, dtype=bool)
    above = np.full(n, -1, dtype=np.int64)
    seed = min(config.seed_size, n)
    index = _new_index(x.shape[1], config)
    kept[:seed] = True
    for start in range(0, seed, 65536):
        index.add(x[start : min(seed, start + 65536)])
    tau, k, m = config.threshold, config.k, config.max_neighbors
    with progress(total=n - seed, desc="dedup", unit="item", disable=not show_progress) as bar:
        for start in range(seed, n, config.batch_size):
            batch = x[start : start + config.batch_size]
            b = len(batch)
            if index.ntotal:
                sims, ids = index.search(batch, min(k, index.ntotal))
                counts = ((sims > tau) & (ids >= 0)).sum(axis=1)
            else:
                counts = np.zeros(b, dtype=np.int64)
            intra = np.tril(batch @ batch.T > tau, k=-1)  # earlier members of the batch only
            has_intra = intra.any(axis=1)
            keep = np.zeros(b, dtype=bool)
            total = counts.astype(np.int64).copy()
            for j in range(b):
                if has_intra[j]:
                    total[j] = counts[j] + int(intra[j, :j][keep[:j]].sum())
                keep[j] = min(k, total[j]) <= m
            above[start : start + b] = np.minimum(k, total)
            kept[start : start + b] = keep
            if keep.any():
                index.add(np.ascontiguousarray(batch[keep]))
            bar.update(b)
    return DedupResult(kept=kept, neighbors_above=above, seed_size=seed)


def dedup_texts(model, texts: list[str], config: DedupConfig | None = None,
                role: Literal["query", "document", "plain"] = "query", cache=None, batch_size: int = 64,
                show_progress: bool = True) -> DedupResult:
    """:func:`diversity_dedup` of ``texts`` encoded through the embedding cache as ``role``."""
    cache = cache if cache is not None else EmbeddingCache()
    emb = cache.encode(model, texts, role=role, batch_size=batch_size, show_progress=show_progress,
                       desc=f"encoding {role}s")
    return diversity_dedup(emb, config, show_progress)
