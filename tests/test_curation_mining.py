"""Hard-negative mining: the pure sampler, MiningConfig, the searchers, the embedding fast path."""

from __future__ import annotations

import random

import numpy as np
import pytest

from medadapt.curation import (
    BM25Searcher,
    DenseSearcher,
    MiningConfig,
    MiningReport,
    margin_threshold,
    mine_from_embeddings,
    mine_hard_negatives,
    sample_negatives,
    write_training_groups,
)
from medadapt.data import load_beir, load_training_groups
from medadapt.errors import ConfigError

CANDS = [(f"d{i}", 1.0 - i / 100) for i in range(1, 31)]  # d1 at rank 1 (0.99) ... d30 at rank 30 (0.70)


def test_window_is_inclusive_one_based_and_counts_positives():
    got = sample_negatives(CANDS, {"d3"}, None, window=(2, 5), num=10, rng=0)
    assert [d for d, _ in got] == ["d2", "d4", "d5"]  # d3 is a positive: skipped, but it holds rank 3


def test_sampling_is_seeded_sorted_and_bounded():
    a = sample_negatives(CANDS, set(), None, window=(1, 30), num=4, rng=random.Random(7))
    b = sample_negatives(CANDS, set(), None, window=(1, 30), num=4, rng=7)
    assert a == b and len(a) == 4
    assert [s for _, s in a] == sorted((s for _, s in a), reverse=True)  # rank order
    assert sample_negatives(CANDS, set(), None, window=(1, 30), num=4, rng=8) != a


def test_margin_and_excluded_ids():
    # pos_score 0.90, margin 0.1 -> limit 0.81: ranks 1..18 (>= 0.82) dropped
    got = sample_negatives(CANDS, set(), 0.90, window=(1, 30), num=30, rng=0, margin=0.1)
    assert got[0] == ("d19", pytest.approx(0.81))
    got = sample_negatives(CANDS, set(), 0.90, window=(1, 30), num=30, rng=0, absolute_margin=0.05)
    assert got[0][0] == "d15"
    got = sample_negatives(CANDS, set(), None, window=(1, 3), num=3, rng=0, excluded_ids={"d2"})
    assert [d for d, _ in got] == ["d1", "d3"]


def test_margin_threshold_never_exceeds_positive_score():
    assert margin_threshold(0.8, 0.1) == pytest.approx(0.72)
    assert margin_threshold(-0.5, 0.1) == pytest.approx(-0.55)
    assert margin_threshold(1.0) == float("inf")


def test_sampler_errors():
    with pytest.raises(ValueError, match="window"):
        sample_negatives(CANDS, set(), None, window=(0, 5))
    with pytest.raises(ValueError, match="pos_score"):
        sample_negatives(CANDS, set(), None, margin=0.1)


def test_mining_config_presets_and_validation():
    assert MiningConfig.preset("hyrec").window == (20, 100)
    assert MiningConfig.preset("med-moe").window == (6, 10) and MiningConfig.preset("med-moe").num_negatives == 5
    bm = MiningConfig.preset("bmretriever", seed=3)
    assert (bm.window, bm.num_negatives, bm.seed, bm.depth) == ((1, 100), 1, 3, 100)
    with pytest.raises(ConfigError, match="valid presets: bmretriever, hyrec, med-moe"):
        MiningConfig.preset("ance")
    with pytest.raises(ValueError, match="window"):
        MiningConfig(window=(10, 5))
    with pytest.raises(ValueError, match=r"windw\n  unknown key \(did you mean window\?\)"):
        MiningConfig(windw=(1, 2))


# ------------------------------------------------------------------------------------ fast path
def _clustered(n_docs=400, dim=32, seed=0):
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n_docs, dim)).astype(np.float32)
    queries = docs[:50] + 0.3 * rng.normal(size=(50, dim)).astype(np.float32)
    return queries, docs


def test_mine_from_embeddings_window_positive_and_determinism():
    q, d = _clustered()
    pos = [{i} for i in range(50)]
    cfg = MiningConfig(window=(2, 20), num_negatives=3, embedding_dup_threshold=None)
    negs, scores = mine_from_embeddings(q, d, pos, cfg, return_scores=True)
    assert all(len(n) == 3 and i not in n for i, n in enumerate(negs))
    # every negative is within ranks 2..20 of the exact ranking
    qn, dn = q / np.linalg.norm(q, axis=1, keepdims=True), d / np.linalg.norm(d, axis=1, keepdims=True)
    for i in range(50):
        order = list(np.argsort(-(dn @ qn[i])))
        assert all(2 <= order.index(j) + 1 <= 20 for j in negs[i])
        assert scores[i] == sorted(scores[i], reverse=True)
    assert mine_from_embeddings(q, d, pos, cfg, query_chunk=7) == negs  # independent of chunking
    assert mine_from_embeddings(q, d, pos, cfg.model_copy(update={"seed": 1})) != negs


def test_mine_from_embeddings_guards():
    q, d = _clustered()
    d[100] = d[0] * 1.01  # a near-copy of query 0's positive
    q[0] = d[0] + 0.01 * d[100]
    pos = [{i} for i in range(50)]
    wide = MiningConfig(window=(1, 3), num_negatives=3, embedding_dup_threshold=None)
    assert 100 in mine_from_embeddings(q, d, pos, wide)[0]
    guarded = wide.model_copy(update={"embedding_dup_threshold": 0.98})
    assert 100 not in mine_from_embeddings(q, d, pos, guarded)[0]
    strict = wide.model_copy(update={"margin": 0.0})  # nothing scoring above the positive
    negs, scores = mine_from_embeddings(q, d, pos, strict, return_scores=True)
    qn = q[0] / np.linalg.norm(q[0])
    pos_score = float(d[0] / np.linalg.norm(d[0]) @ qn)
    assert all(s <= pos_score + 1e-6 for s in scores[0])


def test_mine_from_embeddings_validation_and_speed():
    q, d = _clustered()
    with pytest.raises(ValueError, match="positive sets"):
        mine_from_embeddings(q, d, [set()])
    with pytest.raises(ValueError, match="out of range"):
        mine_from_embeddings(q[:1], d, [{10_000}])
    with pytest.raises(ValueError, match="dimension"):
        mine_from_embeddings(q[:, :5], d, [set()] * 50)
    rng = np.random.default_rng(1)
    big_q, big_d = rng.normal(size=(2000, 64)).astype(np.float32), rng.normal(size=(5000, 64)).astype(np.float32)
    import time

    t = time.perf_counter()
    negs = mine_from_embeddings(big_q, big_d, [{i} for i in range(2000)], MiningConfig.preset("hyrec"))
    assert len(negs) == 2000 and time.perf_counter() - t < 10


# ------------------------------------------------------------------------------------ searchers + high level
def test_bm25_searcher_english_and_chinese():
    s = BM25Searcher(["a", "b", "c"], ["Diabetes raises blood sugar", "Asthma causes wheezing", "Gout hurts toes"])
    hits = s(["blood sugars in diabetics", "zzz"], 3)
    assert hits[0][0][0] == "a" and hits[1] == []
    assert s.score(["wheezing"], [["a", "b"]])[0][0] == 0.0
    zh = BM25Searcher(["x", "y"], ["高血压患者能吃党参吗", "糖尿病的饮食注意什么"], language="zh")
    assert zh(["高血压可以吃党参"], 2)[0][0][0] == "x"
    with pytest.raises(ValueError, match="language"):
        BM25Searcher(["a"], ["t"], language="fr")


def test_bm25_searcher_is_the_retrieval_engine_and_scores_agree():
    """Curation and retrieval share one BM25 engine: same hits and scores as LexicalIndex, and score()
    returns exactly what search returned for the same documents."""
    from medadapt.retrieval.config import LexicalConfig
    from medadapt.retrieval.lexical import LexicalIndex

    texts = ["Diabetes raises blood sugar levels", "Blood pressure and salt", "Gout hurts toes and feet",
             "Low blood sugar: hypoglycaemia in diabetes", "Asthma causes wheezing"]
    ids = [f"d{i}" for i in range(len(texts))]
    s = BM25Searcher(ids, texts)
    queries = ["blood sugar in diabetes", "sore toes"]
    hits = s(queries, 3)
    ref_scores, ref_idx = LexicalIndex.build_bm25(texts, LexicalConfig(language="en"), show_progress=False).search(
        queries, 3)
    for q_hits, rs, ri in zip(hits, ref_scores, ref_idx):
        assert [d for d, _ in q_hits] == [ids[i] for i, sc in zip(ri, rs) if i >= 0 and sc > 0]
        assert [sc for _, sc in q_hits] == pytest.approx([float(sc) for i, sc in zip(ri, rs) if i >= 0 and sc > 0])
    again = s.score(queries, [[d for d, _ in h] for h in hits])
    assert again == [pytest.approx([sc for _, sc in h]) for h in hits]
    assert hits[0][0][0] in ("d0", "d3") and hits[1][0][0] == "d2"


def test_mine_hard_negatives_with_bm25_is_deterministic(tiny_beir_dir, tmp_path):
    data = load_beir(tiny_beir_dir, ["train"])
    searcher = BM25Searcher(data.doc_ids, data.doc_texts())
    cfg = MiningConfig(window=(1, 10), num_negatives=2)
    report = MiningReport()
    groups = mine_hard_negatives(data, "train", searcher, cfg, show_progress=False, report=report)
    again = mine_hard_negatives(data, "train", searcher, cfg, show_progress=False)
    assert [g.to_dict() for g in groups] == [g.to_dict() for g in again]
    assert report.queries == 12 and report.groups == len(groups) > 0
    for g in groups:
        assert g.pos[0] not in g.neg and len(g.neg) <= 2
        assert len(g.pos_scores) == 1 and len(g.neg_scores) == len(g.neg)
    path = tmp_path / "mined.jsonl"
    write_training_groups(path, groups)
    assert [g.to_dict() for g in load_training_groups(path)] == [g.to_dict() for g in groups]


def test_text_near_duplicate_of_positive_is_not_a_negative(tmp_path):
    from conftest import write_beir

    corpus = {
        "p": ("", "High blood pressure: cut salt, exercise, and take your pills every day."),
        "dup": ("", "High blood pressure - cut salt, exercise and take your pills every day!"),
        "n1": ("", "Asthma inhalers open the airway."),
        "n2": ("", "Gout attacks hit the big toe."),
    }
    root = write_beir(tmp_path / "b", corpus, {"q": "high blood pressure salt pills"}, {"train": {"q": {"p": 1}}})
    data = load_beir(root, ["train"])

    def fake_search(texts, k):  # ranks the duplicate first
        return [[("dup", 0.99), ("p", 0.95), ("n1", 0.3), ("n2", 0.2)][:k] for _ in texts]

    cfg = MiningConfig(window=(1, 4), num_negatives=3)
    report = MiningReport()
    (group,) = mine_hard_negatives(data, "train", fake_search, cfg, show_progress=False, report=report)
    assert corpus["dup"][1] not in group.neg and len(group.neg) == 2 and report.excluded_text_duplicates == 1
    assert group.pos_scores == [0.95]  # taken from the hits (fake_search has no .score)
    off = cfg.model_copy(update={"text_dup_threshold": None})
    (group,) = mine_hard_negatives(data, "train", fake_search, off, show_progress=False)
    assert corpus["dup"][1] in group.neg
    margin = cfg.model_copy(update={"text_dup_threshold": None, "margin": 0.0})
    (group,) = mine_hard_negatives(data, "train", fake_search, margin, show_progress=False)
    assert corpus["dup"][1] not in group.neg  # scores above the positive


def test_dense_searcher_uses_the_cache(tiny_bert, tiny_beir_dir, tmp_path):
    from medadapt.cache import EmbeddingCache

    data = load_beir(tiny_beir_dir, ["train"])
    cache = EmbeddingCache(tmp_path / "cache")
    s = DenseSearcher(tiny_bert, data.doc_ids, data.doc_texts(), cache=cache, show_progress=False)
    hits = s(["symptoms of asthma", "gout"], 5)
    assert len(hits) == 2 and len(hits[0]) == 5
    assert [h[1] for h in hits[0]] == sorted((h[1] for h in hits[0]), reverse=True)
    assert s.score(["gout"], [[hits[1][0][0]]])[0][0] == pytest.approx(hits[1][0][1], abs=1e-5)
    assert any((tmp_path / "cache").iterdir())
    groups = mine_hard_negatives(data, "train", s, MiningConfig(window=(1, 6), num_negatives=2),
                                 show_progress=False)
    assert len(groups) == 12 and all(len(g.neg) == 2 for g in groups)


def test_dense_searcher_hashes_the_backbone_once_for_many_query_batches(tiny_bert, tmp_path, monkeypatch):
    """Mining calls the searcher per batch of queries; the weights are fingerprinted once, and the results
    equal a fresh searcher's."""
    import medadapt.cache
    from medadapt.cache import EmbeddingCache
    from medadapt.curation.dense import DenseSearcher
    from medadapt.curation.search import batched_search

    docs = ["gout is arthritis of the toe", "asthma needs an inhaler", "anemia means low iron", "eczema itches"]
    queries = ["toe pain", "wheezing", "tired and pale", "itchy skin", "gout", "inhaler"]
    searcher = DenseSearcher(tiny_bert, [f"d{i}" for i in range(4)], docs, cache=EmbeddingCache(tmp_path),
                             show_progress=False)
    searcher.doc_embeddings  # noqa: B018 - the corpus first
    calls = []
    real = medadapt.cache.modules_fingerprint
    monkeypatch.setattr(medadapt.cache, "modules_fingerprint", lambda *a, **k: calls.append(1) or real(*a, **k))
    hits = batched_search(searcher, queries, 2, batch_size=2, show_progress=False)
    assert len(calls) == 1
    fresh = DenseSearcher(tiny_bert, [f"d{i}" for i in range(4)], docs, cache=EmbeddingCache(tmp_path / "other"),
                          show_progress=False)
    again = batched_search(fresh, queries, 2, batch_size=6, show_progress=False)
    assert [[d for d, _ in row] for row in hits] == [[d for d, _ in row] for row in again]
    assert [s for row in hits for _, s in row] == pytest.approx([s for row in again for _, s in row], abs=1e-5)
