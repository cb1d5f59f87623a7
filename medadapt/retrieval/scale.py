"""Dense indexes at scale: IVF / HNSW / PQ indexes built from a stream of embedding batches.

:func:`build_dense_index` reads a *vector source* (re-iterable ``(ids, vectors)`` batches, or an array /
memmap) without loading it whole, trains on a seeded uniform sample drawn in one pass and adds the batches
one at a time. FAISS does the indexing; only the sampling and batch plumbing are ours. See docs/scaling.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Union

import numpy as np

from medadapt.errors import MedAdaptError
from medadapt.models import load
from medadapt.progress import progress
from medadapt.retrieval.config import DenseConfig, RetrieverConfig
from medadapt.retrieval.dense import (DenseIndex, check_trainable, default_train_size, embedding_dim,
                                      gpu_count, new_index, uses_cosine)
from medadapt.retrieval.encoders import DenseEncoder, as_encoder
from medadapt.retrieval.retriever import Retriever, new_manifest

__all__ = ["VectorSource", "iter_batches", "sample_vectors", "build_dense_index",
           "retriever_from_vectors"]

#: ``(ids, vectors)`` batches (re-iterable or a callable giving a fresh iterator), or an array / memmap.
VectorSource = Union[np.ndarray, Iterable[tuple[Any, np.ndarray]], Callable[[], Iterator[tuple[Any, np.ndarray]]]]


def iter_batches(source: VectorSource, chunk_size: int = 16384) -> Iterator[tuple[Any, np.ndarray]]:
    """A fresh pass over ``source`` (an array or memmap: ``(positions, slice)``, one slice read at a time), each
    batch checked to be 2-D."""
    if isinstance(source, np.ndarray):
        if source.ndim != 2:
            raise MedAdaptError(f"expected a 2-D array of vectors, got shape {source.shape}")
        it: Iterable = ((np.arange(s, min(len(source), s + chunk_size)), source[s:s + chunk_size])
                        for s in range(0, len(source), chunk_size))
    elif callable(source):
        it = source()
    else:
        it = source
    for item in it:
        try:
            ids, vectors = item
        except (TypeError, ValueError):
            raise MedAdaptError("a vector source yields (ids, vectors) pairs; got "
                                f"{type(item).__name__}") from None
        vectors = np.asarray(vectors)
        if vectors.ndim != 2:
            raise MedAdaptError(f"a vector batch must be 2-D (n x d), got shape {vectors.shape}")
        if ids is not None and len(ids) != len(vectors):
            raise MedAdaptError(f"a vector batch has {len(vectors)} vectors but {len(ids)} ids")
        yield ids, vectors


def _one_shot(source) -> bool:
    """An iterator (not an array, a callable or a re-iterable container) can be read only once."""
    return not isinstance(source, np.ndarray) and not callable(source) and iter(source) is source


def sample_vectors(source: VectorSource, n: int, seed: int = 0, chunk_size: int = 16384
                   ) -> tuple[np.ndarray, int]:
    """A uniform random sample of ``min(n, total)`` rows of ``source`` (float32, in source order) and the total,
    in one pass holding at most ``n + batch`` rows: the rows with the ``n`` smallest random keys (drawn in row
    order from ``seed``, so the sample does not depend on the batching)."""
    rng = np.random.default_rng(seed)
    keys = np.empty(0, dtype=np.float64)
    rows = np.empty(0, dtype=np.int64)
    kept: np.ndarray | None = None
    total = 0
    for _, vectors in iter_batches(source, chunk_size):
        b = len(vectors)
        if b == 0:
            continue
        batch_keys = rng.random(b)
        take = np.arange(b) if b <= n else np.argpartition(batch_keys, n - 1)[:n]
        cand = np.ascontiguousarray(vectors[np.sort(take)], dtype=np.float32)
        cand_keys = batch_keys[np.sort(take)]
        if kept is None:
            kept = np.empty((0, vectors.shape[1]), dtype=np.float32)
        elif cand.shape[1] != kept.shape[1]:
            raise MedAdaptError(f"vector batches differ in dimension ({kept.shape[1]} then {cand.shape[1]})")
        keys = np.concatenate([keys, cand_keys])
        rows = np.concatenate([rows, total + np.sort(take)])
        kept = np.concatenate([kept, cand])
        if len(keys) > n:
            keep = np.argpartition(keys, n - 1)[:n]
            keys, rows, kept = keys[keep], rows[keep], kept[keep]
        total += b
    if kept is None:
        raise MedAdaptError("the vector source is empty")
    order = np.argsort(rows, kind="stable")
    return kept[order], total


def build_dense_index(
    source: VectorSource,
    config: DenseConfig | None = None,
    *,
    normalized: bool = True,
    train_sample: np.ndarray | None = None,
    seed: int = 0,
    show_progress: bool = False,
) -> tuple[DenseIndex, list, dict[str, Any]]:
    """Build a FAISS index from a vector source without holding all vectors in memory.

    Args:
        source: batches of ``(ids, vectors)`` or an array / memmap; a one-shot iterator only for indexes that
            need no training, or with ``train_sample`` (vectors to train on instead of sampling the source).
        normalized: L2-normalise vectors (cosine models); ``False`` keeps them raw (dot product).

    Returns:
        ``(index, ids, build)``: the index (positions ``0..n-1`` in source order), the batches' ids (positions
        where a batch gave ``None``), and the build record for the manifest.

    Raises:
        MedAdaptError: an empty source, batches of different dimensions, more IVF lists than training
            vectors, or a one-shot iterator for an index that needs a training pass.
    """
    config = config or DenseConfig()
    t0 = time.perf_counter()
    sample = train_sample
    dim = None if sample is None else int(np.asarray(sample).shape[1])
    if sample is None:
        # the first batch gives the dimension; training then needs a pass of its own over the source
        first = next(iter_batches(source, config.chunk_size), None) if not _one_shot(source) else None
        if first is not None:
            dim = int(first[1].shape[1])
        probe = new_index(dim, config.factory) if dim is not None else None
        if probe is not None and not probe.is_trained:
            sample, n_docs = sample_vectors(source, config.train_size or default_train_size(probe), seed,
                                            config.chunk_size)
            check_trainable(probe, config.factory, len(sample), n_docs)
    t_sample = time.perf_counter() - t0

    def empty(d: int) -> DenseIndex:
        index = DenseIndex.empty(d, config, normalized)
        if not index.is_trained:
            if sample is None:
                raise MedAdaptError(f"FAISS factory {config.factory!r} needs training: pass a vector source that "
                                    "can be read twice (a list, an array, a callable) or train_sample=...")
            index.train(np.asarray(sample, dtype=np.float32))
        return index

    index = empty(dim) if dim is not None else None
    n_train = index.build_info.get("n_train") if index is not None else None
    sample = None
    t_train = time.perf_counter() - t0 - t_sample
    ids: list = []
    bar = progress(desc=f"indexing ({config.factory})", unit="vec", disable=not show_progress)
    try:
        for batch_ids, vectors in iter_batches(source, config.chunk_size):
            if index is None:  # one-shot source: the first batch gives the dimension
                index = empty(int(vectors.shape[1]))
            if vectors.shape[1] != index.dim:
                raise MedAdaptError(f"vector batches differ in dimension ({index.dim} then {vectors.shape[1]})")
            start = index.ntotal
            index.add(vectors)  # float16 is widened to float32 one batch at a time
            if batch_ids is None:
                ids.extend(range(start, start + len(vectors)))
            else:
                ids.extend(batch_ids.tolist() if isinstance(batch_ids, np.ndarray) else list(batch_ids))
            bar.update(len(vectors))
    finally:
        bar.close()
    if index is None or index.ntotal == 0:
        raise MedAdaptError("the vector source is empty")
    t_add = time.perf_counter() - t0 - t_sample - t_train
    build = {
        "source": "vectors",
        "factory": config.factory,
        "nprobe": config.nprobe,
        "ef_search": config.ef_search,
        "k_factor": config.k_factor,
        "n_train": n_train,
        "train_seed": seed if n_train is not None and train_sample is None else None,
        "n_vectors": index.ntotal,
        "dim": index.dim,
        "gpus": gpu_count() if index._on_gpu else 0,
        "gpu_shard": bool(config.gpu_shard and index._on_gpu),
        "seconds": {"sample": round(t_sample, 3), "train": round(t_train, 3), "add": round(t_add, 3)},
    }
    index.build_info = dict(build)
    return index, ids, build


def retriever_from_vectors(docs, model, source: VectorSource, config: RetrieverConfig | None = None, *,
                           model_name: str | None = None, seed: int = 0, show_progress: bool = False):
    """A dense :class:`~medadapt.retrieval.Retriever` over ``docs`` built from precomputed document embeddings
    of ``model`` (one per document, in ``docs`` order; ids, when given, ``docs.ids`` or ``0..n-1``); the model
    encodes queries and is recorded in the manifest. A kind other than ``dense``, another dimension than the
    model's, or ids / a count that do not match ``docs`` is a :class:`MedAdaptError`."""
    config = config or RetrieverConfig()
    if config.kind != "dense":
        raise MedAdaptError(f"retriever_from_vectors builds dense indexes (got kind={config.kind!r}); build the "
                            "lexical side with Retriever.build")
    if isinstance(model, str):
        model_name = model_name or model
        model = load(model)
    encoder = as_encoder(model)
    if not isinstance(encoder, DenseEncoder):
        raise MedAdaptError("retriever_from_vectors needs a dense model to encode queries")
    index, ids, build = build_dense_index(source, config.dense, normalized=uses_cosine(encoder), seed=seed,
                                          show_progress=show_progress)
    dim = embedding_dim(encoder)
    if dim is not None and dim != index.dim:
        raise MedAdaptError(f"the vectors have dimension {index.dim} but the model gives {dim}: they were not "
                            "computed by this model")
    if len(ids) != len(docs):
        raise MedAdaptError(f"the vector source gave {len(ids)} vectors for {len(docs)} documents")
    doc_ids = list(docs.ids)
    if ids != doc_ids and ids != list(range(len(docs))):
        bad = next(i for i, (a, b) in enumerate(zip(ids, doc_ids)) if a != b and a != i)
        raise MedAdaptError(f"vector {bad} has id {ids[bad]!r} but document {bad} is {doc_ids[bad]!r}: the "
                            "vectors must follow the documents' order")
    manifest = new_manifest(docs, config, encoder, model_name, embedding_dim=index.dim,
                            normalized=index.normalized, build=build)
    return Retriever(config, doc_ids, docs, encoder, index, None, manifest)
