"""Indexes at scale (medadapt.retrieval.scale): IVF / HNSW / PQ indexes built from streamed float16 / float32
batches, recall against exact search, the build record in the manifest, and the Retriever / LangChain serving
them unchanged."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from medadapt.errors import MedAdaptError
from medadapt.retrieval import DenseConfig, Documents, Retriever, RetrieverConfig
from medadapt.retrieval.exact import exact_search, normalize_rows
from medadapt.retrieval.scale import build_dense_index, iter_batches, retriever_from_vectors, sample_vectors

from conftest import TOPICS


pytestmark = pytest.mark.usefixtures("_isolated_cache")


def clustered(n: int = 4000, dim: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(40, dim))
    return (centers[rng.integers(0, 40, n)] + 0.3 * rng.normal(size=(n, dim))).astype(np.float16)


def batches(x: np.ndarray, size: int):
    """A re-iterable source: a callable giving a fresh iterator of (ids, float16 batch)."""
    return lambda: ((np.arange(s, min(len(x), s + size)), x[s:s + size]) for s in range(0, len(x), size))


def recall_at_10(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, truth)]))


@pytest.fixture(scope="module")
def data():
    x = clustered()
    rng = np.random.default_rng(1)
    q = normalize_rows(x[:100].astype(np.float32) + 0.2 * rng.normal(size=(100, x.shape[1])).astype(np.float32))
    _, truth = exact_search(q, normalize_rows(x.astype(np.float32)), 10)
    return x, q, truth


def test_ivf_visiting_every_list_equals_exact_search(data):
    x, q, truth = data
    index, ids, build = build_dense_index(batches(x, 700), DenseConfig(factory="IVF16,Flat", nprobe=16, train_size=800))
    assert index.ntotal == len(x) and ids == list(range(len(x)))
    _, found = index.search(q, 10)
    assert recall_at_10(found, truth) == 1.0
    assert build["n_train"] == 800 and build["n_vectors"] == len(x) and build["factory"] == "IVF16,Flat"
    assert build["train_seed"] == 0 and build["nprobe"] == 16 and build["dim"] == 32


@pytest.mark.parametrize("factory, params, floor", [
    ("IVF16,PQ8x4fs,RFlat", {"nprobe": 8, "k_factor": 16}, 0.9),
    ("HNSW16", {"ef_search": 64}, 0.95),
    ("IVF16_HNSW16,PQ16x4fs,Refine(SQfp16)", {"nprobe": 4, "k_factor": 16}, 0.9),
])
def test_compressed_and_graph_indexes_reach_their_recall(data, factory, params, floor):
    x, q, truth = data
    index, _, _ = build_dense_index(batches(x, 1000), DenseConfig(factory=factory, train_size=2000, **params))
    _, found = index.search(q, 10)
    assert recall_at_10(found, truth) >= floor
    if "k_factor" in params:  # the refine stage re-ranks k_factor * k candidates: without it recall drops
        index.config = index.config.model_copy(update={"k_factor": 1.0})
        index.apply_search_params()
        assert index._cpu.k_factor == 1.0
        assert recall_at_10(index.search(q, 10)[1], truth) < recall_at_10(found, truth)


def test_training_sample_is_uniform_and_independent_of_batching():
    x = np.arange(10_000, dtype=np.float32).reshape(-1, 1).repeat(4, axis=1)
    a, total = sample_vectors(x, 500, seed=3, chunk_size=1000)
    b, _ = sample_vectors([(None, x[s:s + 777]) for s in range(0, len(x), 777)], 500, seed=3)
    assert total == 10_000 and a.shape == (500, 4) and np.array_equal(a, b)
    rows = a[:, 0].astype(int)
    assert len(set(rows)) == 500 and list(rows) == sorted(rows)  # distinct rows, kept in source order
    assert 3500 < rows.mean() < 6500  # spread over the whole source, not its beginning
    c, _ = sample_vectors(x, 500, seed=4, chunk_size=1000)
    assert not np.array_equal(a, c)
    small, total = sample_vectors(x[:20], 500)
    assert total == 20 and len(small) == 20


def test_bad_sources_are_refused_clearly(data):
    x, _, _ = data
    one_shot = iter([(None, x[:2000]), (None, x[2000:])])
    with pytest.raises(MedAdaptError, match="needs training: pass a vector source that can be read twice"):
        build_dense_index(one_shot, DenseConfig(factory="IVF16,Flat"))
    index, ids, build = build_dense_index(iter([(["a", "b"], x[:2]), (["c"], x[2:3])]), DenseConfig(factory="HNSW16"))
    assert ids == ["a", "b", "c"] and index.ntotal == 3 and build["n_train"] is None
    with pytest.raises(MedAdaptError, match="differ in dimension"):
        build_dense_index([(None, x[:10]), (None, x[:10, :16])], DenseConfig(factory="Flat"))
    with pytest.raises(MedAdaptError, match="empty"):
        build_dense_index([], DenseConfig(factory="Flat"))
    with pytest.raises(MedAdaptError, match="nlist=1024 IVF lists"):
        build_dense_index(x[:500], DenseConfig(factory="IVF1024,Flat"))
    with pytest.raises(MedAdaptError, match="3 ids"):
        list(iter_batches([(["a", "b", "c"], x[:2])]))


def tiny_docs() -> Documents:
    ids, texts = [], []
    for i, (name, words) in enumerate(TOPICS):
        ids += [f"d{i}", f"s{i}"]
        texts += [f"{name} is a condition with {words}.", f"symptoms of {name}: {words.split()[0]} and more"]
    return Documents(ids, texts)


def test_retriever_serves_a_streamed_index_unchanged(tiny_bert, tmp_path):
    docs = tiny_docs()
    emb = tiny_bert.encode_document(docs.indexed_texts()).astype(np.float16)  # e.g. a float16 cache
    cfg = RetrieverConfig(dense=DenseConfig(factory="IVF2,Flat", nprobe=2, train_size=24))
    r = retriever_from_vectors(docs, tiny_bert, batches(emb, 5), cfg, model_name="tiny")
    queries = ["asthma inhaler", "uric acid toe", "sleep at night"]
    ref = Retriever.build(docs, tiny_bert, kind="dense", show_progress=False).batch_search(queries, 5)
    got = r.batch_search(queries, 5)
    assert [x.ids for x in got] == [x.ids for x in ref]
    np.testing.assert_allclose([x.scores for x in got], [x.scores for x in ref], atol=2e-3)  # float16 vectors
    path = r.save(tmp_path / "idx")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["build"]["n_train"] == 24 and manifest["build"]["factory"] == "IVF2,Flat"
    assert manifest["config"]["dense"]["nprobe"] == 2 and manifest["embedding_dim"] == 32
    loaded = Retriever.load(path, model=tiny_bert)
    assert loaded.manifest.build == manifest["build"]
    assert [x.ids for x in loaded.batch_search(queries, 5)] == [x.ids for x in got]
    pytest.importorskip("langchain_core")
    from medadapt.retrieval import MedAdaptRetriever

    lc = MedAdaptRetriever(retriever=loaded, k=3)
    assert [d.id for d in lc.invoke("asthma inhaler")] == [d.id for d in asyncio.run(lc.ainvoke("asthma inhaler"))] \
        == got[0].ids[:3]


def test_retriever_from_vectors_refuses_vectors_of_another_model_or_order(tiny_bert):
    docs = tiny_docs()
    emb = tiny_bert.encode_document(docs.indexed_texts())
    with pytest.raises(MedAdaptError, match="dimension 16 but the model gives 32"):
        retriever_from_vectors(docs, tiny_bert, emb[:, :16])
    with pytest.raises(MedAdaptError, match="gave 23 vectors for 24 documents"):
        retriever_from_vectors(docs, tiny_bert, emb[:23])
    shuffled = [(docs.ids[::-1], emb[::-1])]
    with pytest.raises(MedAdaptError, match="must follow the documents' order"):
        retriever_from_vectors(docs, tiny_bert, shuffled)
    with pytest.raises(MedAdaptError, match="builds dense indexes"):
        retriever_from_vectors(docs, tiny_bert, emb, RetrieverConfig(kind="hybrid"))


def test_refine_k_factor_is_restored_from_the_manifest(tiny_bert, tmp_path):
    docs = tiny_docs()
    emb = tiny_bert.encode_document(docs.indexed_texts())
    cfg = RetrieverConfig(dense=DenseConfig(factory="PQ4x4fs,RFlat", k_factor=6))
    r = retriever_from_vectors(docs, tiny_bert, emb, cfg, model_name="tiny")
    loaded = Retriever.load(r.save(tmp_path / "idx"), model=tiny_bert)
    assert loaded.dense._cpu.k_factor == 6.0 and loaded.config.dense.k_factor == 6.0


def test_gpu_sharding_uses_faiss_index_shards_options(monkeypatch):
    """With GPUs, ``gpu_shard`` asks FAISS to split the index across them (its IndexShards), else replicate."""
    import faiss

    from medadapt.retrieval.dense import DenseIndex

    class Options:  # faiss.GpuMultipleClonerOptions exists only in faiss-gpu builds
        shard = False

    seen = []
    monkeypatch.setattr(faiss, "GpuMultipleClonerOptions", Options, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_all_gpus", lambda index, co=None: seen.append(co.shard) or index,
                        raising=False)
    DenseIndex.empty(8, DenseConfig(factory="Flat", gpu_shard=True))
    DenseIndex.empty(8, DenseConfig(factory="Flat"))
    assert seen == [True, False]


@pytest.mark.skipif("__import__('faiss').get_num_gpus() == 0", reason="needs faiss-gpu and a GPU")
def test_gpu_sharded_index_equals_cpu(data):  # pragma: no cover - runs on GPU machines only
    x, q, truth = data
    index, _, build = build_dense_index(x, DenseConfig(factory="IVF16,Flat", nprobe=16, gpu_shard=True))
    assert build["gpus"] >= 1
    assert recall_at_10(index.search(q, 10)[1], truth) == 1.0


def test_retriever_build_records_the_training_sample_in_the_manifest(tiny_bert, tmp_path):
    cfg = RetrieverConfig(dense=DenseConfig(factory="IVF2,Flat", nprobe=2, train_size=20))
    r = Retriever.build(tiny_docs(), tiny_bert, config=cfg, model_name="tiny", show_progress=False)
    manifest = json.loads((r.save(tmp_path / "ivf") / "manifest.json").read_text())
    assert manifest["build"] == {"n_train": 20}
    flat = Retriever.build(tiny_docs(), tiny_bert, kind="dense", model_name="tiny", show_progress=False)
    assert "build" not in json.loads((flat.save(tmp_path / "flat") / "manifest.json").read_text())


@pytest.mark.parametrize("factory, ondisk", [("IVF16,Flat", False), ("IVF16,Flat", True), ("Flat", False),
                                             ("HNSW16", False)])
def test_sharded_build_equals_one_build_and_a_damaged_shard_is_refused(data, tmp_path, factory, ondisk):
    """Three shards built from one template and merged search like one index over the whole corpus
    (IVF: lists merged, in memory or on disk; Flat: codes appended; HNSW: searched side by side); a shard
    that does not match its ``.sha256`` is one clear error before FAISS reads it."""
    from medadapt.retrieval import build_shard, merge_shards, train_shard_template

    x, q, truth = data
    x = normalize_rows(x.astype(np.float32))
    cfg = DenseConfig(factory=factory, nprobe=16, ef_search=256)
    template = train_shard_template(x[:800], cfg, tmp_path / "template.faiss")
    assert (tmp_path / "template.faiss.sha256").is_file()
    cuts = [0, 1500, 2600, len(x)]
    shards = [build_shard(template, x[a:b], a, tmp_path / f"shard-{i}.faiss")
              for i, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    merged = merge_shards(shards, cfg, ondisk=tmp_path / "merged.ivfdata" if ondisk else None)
    assert merged.ntotal == len(x)
    _, found = merged.search(q, 10)
    assert recall_at_10(found, truth) >= (1.0 if factory != "HNSW16" else 0.98)
    shards[1].write_bytes(shards[1].read_bytes()[:-64])
    with pytest.raises(MedAdaptError, match="shard-1.faiss: missing, or differs from shard-1.faiss.sha256"):
        merge_shards(shards, cfg, ondisk=tmp_path / "again.ivfdata" if ondisk else None)
    (tmp_path / "template.faiss.sha256").unlink()
    with pytest.raises(MedAdaptError, match="no readable template.faiss.sha256"):
        build_shard(template, x[:10], 0, tmp_path / "late.faiss")
