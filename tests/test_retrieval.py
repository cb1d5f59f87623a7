"""Retrieval: dense / lexical engines vs brute force, BM25 vs bm25s, fusion, persistence, threads,
LangChain, CLI. Tiny models from conftest; no downloads."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import scipy.sparse as sp

from medadapt.errors import ConfigError
from medadapt.retrieval import (
    DenseConfig,
    DenseIndex,
    FusionConfig,
    IndexCorruptError,
    IndexMismatchError,
    InvertedIndex,
    LexicalIndex,
    Retriever,
    RetrieverConfig,
    minmax_fusion,
    rrf_fusion,
    zscore_fusion,
)
from medadapt.retrieval.fusion import fuse, fuse_runs

from _helpers import tiny_docs
from conftest import TOPICS, build_tiny_bert


pytestmark = pytest.mark.usefixtures("_isolated_cache")


def brute_topk(scores: np.ndarray, k: int) -> list[list[int]]:
    return [list(np.lexsort((np.arange(len(row)), -row))[:k]) for row in scores]


# ---------------------------------------------------------------------- engines vs brute force
@pytest.mark.parametrize("factory", ["Flat", "HNSW32", "IVF4,Flat"])
def test_dense_index_equals_brute_force(factory):
    rng = np.random.default_rng(0)
    docs, queries = rng.standard_normal((400, 24)), rng.standard_normal((20, 24))
    cfg = DenseConfig(factory=factory, ef_search=400, nprobe=4, train_size=400)
    index = DenseIndex.build(docs, cfg)
    scores, idx = index.search(queries, 10)
    dn = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    qn = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    ref = brute_topk(qn @ dn.T, 10)
    assert [list(r) for r in idx] == ref
    np.testing.assert_allclose(scores, np.take_along_axis(qn @ dn.T, np.array(ref), 1), rtol=1e-4, atol=1e-5)


def test_inverted_index_equals_sparse_dot_products():
    rng = np.random.default_rng(1)
    d = sp.random(300, 50, density=0.1, random_state=1, dtype=np.float32)
    q = sp.random(15, 50, density=0.15, random_state=2, dtype=np.float32)
    d.data[:] = rng.integers(1, 4, d.nnz)  # integer weights create ties: tie-break must be by index
    index = InvertedIndex.from_matrix(d)
    scores, idx = index.search(q, 7)
    dense = (q @ d.T).toarray()
    for r in range(15):
        ref = [j for j in brute_topk(dense[r : r + 1], 7)[0] if dense[r, j] > 0]
        assert list(idx[r][: len(ref)]) == ref and (idx[r][len(ref) :] == -1).all()
        np.testing.assert_allclose(scores[r][: len(ref)], dense[r, ref], rtol=1e-6)
    # dict input (learned sparse vectors) goes through the same engine
    lex = LexicalIndex.from_sparse([{0: 1.0, 3: 2.0}, {3: 1.0}, {7: 5.0}])
    s, i = lex.search([{3: 1.0}], 3)
    assert list(i[0]) == [0, 1, -1] and list(s[0][:2]) == [2.0, 1.0]


def test_bm25_matches_bm25s():
    bm25s = pytest.importorskip("bm25s")
    Stemmer = pytest.importorskip("Stemmer")
    docs = tiny_docs()
    texts = docs.indexed_texts()
    queries = ["symptoms of asthma and wheezing", "blood pressure blood", "the fever of flu", "zzz unknown"]
    stem = Stemmer.Stemmer("english")
    ref = bm25s.BM25()
    ref.index(bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False), show_progress=False)
    lex = LexicalIndex.build_bm25(texts, show_progress=False)
    assert lex.language == "en"
    for q in queries:
        vocab_q = bm25s.tokenize([q], stopwords="en", stemmer=stem, return_ids=False, show_progress=False)[0]
        expected = ref.get_scores(vocab_q)
        got = np.zeros(len(texts))
        s, i = lex.search([q], len(texts))
        got[i[0][i[0] >= 0]] = s[0][i[0] >= 0]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- fusion
def test_fusion_hand_made_examples_and_missing_rule():
    dense, lex = {"a": 0.9, "b": 0.5, "c": 0.1}, {"b": 8.0, "d": 4.0, "e": 2.0}
    fused = minmax_fusion([dense, lex], weights=[0.5, 0.5])
    # a: 0.5*1 + 0.5*0 (missing -> lowest normalised = 0); b: 0.5*0.5 + 0.5*1; d: 0.5*0 + 0.5*(1/3)
    assert fused == pytest.approx({"b": 0.75, "a": 0.5, "d": 1 / 6, "c": 0.0, "e": 0.0})
    assert list(fused)[:2] == ["b", "a"] and list(fused)[-2:] == ["c", "e"]  # ties by doc id
    z = zscore_fusion([dense, lex], weights=[1, 0])
    zmin = min(z.values())
    assert z["d"] == pytest.approx(zmin) and z["e"] == pytest.approx(zmin)  # missing = list's min z-score
    rrf = rrf_fusion([dense, lex])
    assert rrf["b"] == pytest.approx(1 / 62 + 1 / 61) and rrf["a"] == pytest.approx(1 / 61)  # missing adds 0
    assert list(rrf_fusion([dense, lex], k=2)) == ["b", "a"]
    assert minmax_fusion([{"x": 2.0}, {}]) == {"x": 0.5}  # an empty list contributes nothing
    assert minmax_fusion([{"x": 3.0, "y": 3.0}], k=1) == {"x": 1.0}  # constant list -> 1.0
    raw = fuse([dense, lex], "sum", weights=[0.5, 0.5])  # raw scores, missing -> the list's lowest score
    assert raw == pytest.approx({"b": 4.25, "d": 2.05, "e": 1.05, "a": 1.45, "c": 1.05})
    runs = fuse_runs([{"q": dense}, {"q": lex, "q2": {"z": 1.0}}], method="rrf")
    assert set(runs) == {"q", "q2"}
    with pytest.raises(ValueError, match="minmax, zscore, rrf"):
        fuse_runs([{"q": dense}], method="mean")


# ---------------------------------------------------------------------- retriever + persistence
@pytest.fixture()
def built(tiny_bert, tmp_path):
    r = Retriever.build(tiny_docs(), tiny_bert, kind="hybrid", model_name="tiny", show_progress=False)
    return r, r.save(tmp_path / "idx")


def test_retriever_kinds_and_round_trip(built, tiny_bert):
    r, path = built
    queries = ["asthma inhaler", "uric acid toe", "sleep at night"]
    before = r.batch_search(queries, 5)
    loaded = Retriever.load(path, model=tiny_bert)
    after = loaded.batch_search(queries, 5)
    assert [x.ids for x in before] == [x.ids for x in after]
    np.testing.assert_allclose([x.scores for x in before], [x.scores for x in after], rtol=1e-5)
    hit = next(iter(after[1]))
    assert hit.rank == 1 and hit.text and hit.id in r.ids
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["model"]["fingerprint"] and manifest["embedding_dim"] == 32 and manifest["n_docs"] == 24
    assert manifest["normalized"] is True and len(manifest["corpus_hash"]) == 64 and manifest["medadapt_version"]
    # dense top-k equals brute force over the model's own embeddings (queries through encode_query)
    dense = Retriever.build(tiny_docs(), tiny_bert, kind="dense", show_progress=False)
    q = tiny_bert.encode_query(queries, normalize_embeddings=True)
    d = tiny_bert.encode_document(tiny_docs().indexed_texts(), normalize_embeddings=True)
    ref = brute_topk(q @ d.T, 5)
    assert [x.ids for x in dense.batch_search(queries, 5)] == [[dense.ids[j] for j in row] for row in ref]
    lexical = Retriever.build(tiny_docs(), kind="lexical", show_progress=False)
    assert lexical.search("gout uric acid", 1).ids == ["d9"]
    assert not (path.parent / f".{path.name}.tmp").exists()
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


def test_sum_fusion_scores_bm25_and_dense_candidates_exactly(tiny_bert):
    """Hybrid with ``sum`` rescores every candidate of either top list with its true BM25 and cosine."""
    docs = tiny_docs()
    cfg = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=0.3, depth=3))
    r = Retriever.build(docs, tiny_bert, config=cfg, show_progress=False)
    query = "gout uric acid toe"
    res = r.search(query, k=5)
    bm25 = Retriever.build(docs, kind="lexical", config=cfg, show_progress=False).search(query, 24)
    lex = dict(zip(bm25.ids, bm25.scores))
    q = tiny_bert.encode_query([query], normalize_embeddings=True)[0]
    d = tiny_bert.encode_document(docs.indexed_texts(), normalize_embeddings=True)
    assert len(res) == 5 and res.scores == sorted(res.scores, reverse=True)
    for doc_id, score in zip(res.ids, res.scores):
        cos = float(d[docs.ids.index(doc_id)] @ q)
        assert score == pytest.approx(lex.get(doc_id, 0.0) + 0.3 * cos, abs=1e-4)  # lexical + dense_weight * dense


def test_minmax_fusion_in_the_retriever_weighs_dense_by_dense_weight(tiny_bert):
    """``minmax`` hybrid: each top-``depth`` list min-max normalised, ``dense_weight * dense + lexical``
    (missing = 0), computed here by hand from the dense and lexical retrievers' own lists."""
    docs = tiny_docs()
    cfg = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="minmax", dense_weight=0.3, depth=6))
    query = "gout uric acid toe"
    res = Retriever.build(docs, tiny_bert, config=cfg, show_progress=False).search(query, k=6)
    dense = Retriever.build(docs, tiny_bert, kind="dense", show_progress=False).search(query, 6)
    lexical = Retriever.build(docs, kind="lexical", config=cfg, show_progress=False).search(query, 6)

    def minmax(ids, scores):
        lo, hi = min(scores), max(scores)
        return {i: (s - lo) / (hi - lo) for i, s in zip(ids, scores)}

    d, lx = minmax(dense.ids, dense.scores), minmax(lexical.ids, lexical.scores)
    expected = {i: 0.3 * d.get(i, 0.0) + lx.get(i, 0.0) for i in {*d, *lx}}
    best = sorted(expected.items(), key=lambda kv: (-kv[1], kv[0]))[:6]
    assert res.ids == [i for i, _ in best]
    assert res.scores == pytest.approx([v for _, v in best], abs=1e-5)


def test_mismatched_model_and_corrupted_files_refused(built, tmp_path):
    _, path = built
    other = build_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(IndexMismatchError, match="built with model 'tiny'") as err:
        Retriever.load(path, model=str(other))
    assert "\n" not in str(err.value)
    import shutil

    for name, damage in [("dense.faiss", b"garbage"), ("lexical.safetensors", None), ("docs.jsonl", b"x")]:
        bad = tmp_path / f"bad-{name}"
        shutil.copytree(path, bad)
        f = bad / name
        if damage is None:
            f.unlink()
        else:
            data = bytearray(f.read_bytes())
            data[: len(damage)] = damage
            f.write_bytes(bytes(data))
        with pytest.raises(IndexCorruptError) as err:
            Retriever.load(bad, model=str(other))
        assert "\n" not in str(err.value) and name in str(err.value)
    (tmp_path / "notindex").mkdir()
    (tmp_path / "notindex" / "x").write_text("keep me")
    with pytest.raises(IndexCorruptError, match="not a medadapt index"):
        Retriever.load(tmp_path / "notindex")
    r = Retriever.build(tiny_docs(), kind="lexical", show_progress=False)
    with pytest.raises(ConfigError, match="refusing to overwrite"):
        r.save(tmp_path / "notindex")
    assert (tmp_path / "notindex" / "x").read_text() == "keep me"


def test_concurrent_search_from_threads(built):
    r, _ = built
    queries = [f"{name} {words}" for name, words in TOPICS] * 2
    expected = [r.search(q, 5).ids for q in queries]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: r.search(q, 5).ids, queries))
    assert got == expected


def test_langchain_invoke_equals_ainvoke(built):
    pytest.importorskip("langchain_core")
    from medadapt.retrieval import MedAdaptEmbeddings, MedAdaptRetriever

    r, _ = built
    lc = MedAdaptRetriever(retriever=r, k=4)
    sync = lc.invoke("asthma wheezing")
    async_ = asyncio.run(lc.ainvoke("asthma wheezing"))
    assert [d.id for d in sync] == [d.id for d in async_] == r.search("asthma wheezing", 4).ids
    assert sync[0].metadata["rank"] == 1 and "score" in sync[0].metadata and sync[0].page_content
    emb = MedAdaptEmbeddings(r.model)
    assert len(emb.embed_query("gout")) == 32 and len(emb.embed_documents(["a", "b"])) == 2


# ---------------------------------------------------------------------- CLI
def _cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "medadapt", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_cli_index_search_round_trip_and_errors(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from typer.testing import CliRunner

    from medadapt.cli import app

    runner = CliRunner()
    out = tmp_path / "idx"
    res = runner.invoke(app, ["index", "--model", str(tiny_bert_dir), "--corpus", str(tiny_beir_dir),
                              "--out", str(out), "--kind", "hybrid", "--factory", "HNSW16", "--dense-weight", "0.3",
                              "-q"])  # the random tiny model's dense scores are near-ties: let BM25 decide
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["search", "--index", str(out), "gout uric acid", "-k", "3"])
    assert res.exit_code == 0 and "d9" in res.output, res.output
    run = tmp_path / "run.trec"
    res = runner.invoke(app, ["search", "--index", str(out), "--queries", str(tiny_beir_dir / "queries.jsonl"),
                              "--output", str(run), "-k", "3", "--tag", "t1"])
    assert res.exit_code == 0, res.output
    lines = run.read_text().splitlines()
    assert len(lines) == 24 * 3
    qid, q0, did, rank, score, tag = lines[0].split()
    assert q0 == "Q0" and rank == "1" and tag == "t1" and float(score) > 0
    lexical = tmp_path / "lex"
    assert runner.invoke(app, ["index", "--corpus", str(tiny_beir_dir / "corpus.jsonl"), "--out", str(lexical),
                               "--kind", "lexical", "-q"]).exit_code == 0
    other = build_tiny_bert(tmp_path / "other", seed=2)
    assert runner.invoke(app, ["search", "--index", str(lexical), "--model", str(other), "q"]).exit_code == 0
    # a real process: one "error:" line on stderr, exit 1, no traceback
    proc = _cli("search", "--index", str(out), "--model", str(other), "gout")
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(err) == 1 and err[0].startswith("error:") and "was built with model" in err[0], proc.stderr
    (out / "docs.offsets.npy").write_bytes(b"broken")
    cases = [
        (["search", "--index", str(tmp_path / "none"), "q"], "index folder not found"),
        (["search", "--index", str(out), "q"], "docs.offsets.npy"),
        (["index", "--corpus", str(tmp_path / "nocorpus"), "--out", str(tmp_path / "x")], "corpus not found"),
        (["index", "--corpus", "medmini", "--out", str(tmp_path / "x"), "--kind", "lexical", "--language", "fr"],
         "lexical.language"),
        (["search", "--index", str(lexical)], "either one QUERY or --queries"),
    ]
    for args, message in cases:
        res = runner.invoke(app, args)
        text = " ".join(res.output.split())
        assert res.exit_code == 1 and "error:" in text and message in text, (args, res.output)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)


def test_minmax_fusion_keeps_the_evidence_of_a_single_hit_list():
    """A list with one hit (BM25 matching one document) normalises to 1; documents it did not return get 0,
    not its floor of 1, so the hit still counts (it used to tie with every missing document)."""
    from medadapt.retrieval.fusion import minmax_fusion

    lexical = {"d9": 2.94}
    dense = {"d1": 0.95, "d2": 0.93, "d9": 0.90}
    fused = minmax_fusion([dense, lexical], weights=[0.3, 0.7])
    assert list(fused)[0] == "d9"
    assert fused["d9"] == pytest.approx(0.7) and fused["d1"] == pytest.approx(0.3)
