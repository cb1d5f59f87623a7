"""A HyReC model inside the RAG Retriever: learned sparse vectors in the inverted index, dense vectors in
FAISS, NM-sum hybrid, save -> load, model mismatch, LangChain."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medadapt.hyrec.model import HyReCConfig, HyReCModel
from medadapt.retrieval import FusionConfig, IndexMismatchError, Retriever, RetrieverConfig, load_documents

QUERIES = ["gout condition", "asthma is a condition with wheezing", "migraine condition"]  # "condition": every doc


@pytest.fixture()
def hyrec_dir(tiny_bert_dir, tmp_path):
    torch.manual_seed(0)
    cfg = HyReCConfig(branch_layers=1, language="en", pooling="mean", n_word_buckets=1000,
                      query_max_length=16, passage_max_length=48)
    model = HyReCModel.from_backbone(str(tiny_bert_dir), cfg)
    with torch.no_grad():
        model.weight_proj.linear.weight.normal_(0.0, 0.5)
        model.weight_proj.linear.bias.fill_(0.5)
        model.union_proj.linear.bias.copy_(torch.tensor([2.0, 0.0, 0.0, 0.0]))
    model.save(tmp_path / "hyrec")
    return tmp_path / "hyrec"


def _brute_force(model, docs, queries, k):
    """Top-k (position, score) by sparse dot products of the model's own vectors."""
    dvecs = model.encode_lexical(docs.indexed_texts(), "document")
    out = []
    for q in model.encode_lexical(queries, "query"):
        scores = [sum(w * d.get(t, 0.0) for t, w in q.items()) for d in dvecs]
        order = sorted((i for i in range(len(scores)) if scores[i] > 0), key=lambda i: (-scores[i], i))[:k]
        out.append([(docs.ids[i], scores[i]) for i in order])
    return out


def test_lexical_kind_searches_learned_sparse_vectors(hyrec_dir, tiny_beir_dir):
    docs = load_documents(tiny_beir_dir)
    model = HyReCModel.load(hyrec_dir)
    r = Retriever.build(docs, model=str(hyrec_dir), kind="lexical", show_progress=False)
    assert r.hyrec and r.lexical.kind == "sparse" and r.dense is None
    got = r.batch_search(QUERIES, k=4)
    want = _brute_force(model, docs, QUERIES, 4)
    assert all(len(res) >= 1 for res in got) and sum(len(res) for res in got) > len(QUERIES)
    for res, exp in zip(got, want):
        assert res.ids == [i for i, _ in exp]
        np.testing.assert_allclose(res.scores, [s for _, s in exp], rtol=1e-5)


def test_hybrid_sum_is_the_nm_sum_and_round_trips(hyrec_dir, tiny_beir_dir, tmp_path):
    docs = load_documents(tiny_beir_dir)
    model = HyReCModel.load(hyrec_dir)
    cfg = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=0.5, depth=50))
    r = Retriever.build(docs, model=str(hyrec_dir), config=cfg, show_progress=False)
    res = r.search(QUERIES[0], k=len(docs))
    dvec = model.encode_dense(docs.indexed_texts(), "document")
    q_dense = model.encode_dense(QUERIES[:1], "query")[0]
    lex = dict(_brute_force(model, docs, QUERIES[:1], len(docs))[0])
    for doc_id, score in zip(res.ids, res.scores):
        i = docs.ids.index(doc_id)
        assert score == pytest.approx(0.5 * lex.get(doc_id, 0.0) + 0.5 * float(dvec[i] @ q_dense), abs=1e-5)

    # shallow lists: each candidate is still scored exactly (no floor for a document missing from a list)
    r.config = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=0.5, depth=2))
    shallow = r.search(QUERIES[0], k=3)
    assert 2 <= len(shallow) <= 3
    for doc_id, score in zip(shallow.ids, shallow.scores):
        i = docs.ids.index(doc_id)
        assert score == pytest.approx(0.5 * lex.get(doc_id, 0.0) + 0.5 * float(dvec[i] @ q_dense), abs=1e-5)
    r.config = cfg

    r.save(tmp_path / "index")
    again = Retriever.load(tmp_path / "index")  # reloads the HyReC model from its recorded folder
    assert again.hyrec and again.manifest.encoder == "hyrec"
    back = again.search(QUERIES[0], k=len(docs))
    assert back.ids == res.ids
    np.testing.assert_allclose(back.scores, res.scores, rtol=1e-6)

    from medadapt.retrieval import MedAdaptRetriever

    lc = MedAdaptRetriever(retriever=again, k=3).invoke(QUERIES[0])
    assert [d.metadata["id"] for d in lc] == res.ids[:3]


def test_load_refuses_another_hyrec_model(hyrec_dir, tiny_beir_dir, tmp_path):
    docs = load_documents(tiny_beir_dir)
    Retriever.build(docs, model=str(hyrec_dir), kind="dense", show_progress=False).save(tmp_path / "index")
    other = HyReCModel.load(hyrec_dir)
    with torch.no_grad():
        other.weight_proj.linear.bias.add_(0.1)  # the lexical side changed: a different model
    with pytest.raises(IndexMismatchError, match="fingerprint"):
        Retriever.load(tmp_path / "index", model=other)
    assert Retriever.load(tmp_path / "index", model=str(hyrec_dir)).search(QUERIES[1], k=2).ids


def test_cli_indexes_and_searches_with_a_hyrec_folder(hyrec_dir, tiny_beir_dir, tmp_path):
    from typer.testing import CliRunner

    from medadapt.cli import app

    runner = CliRunner()
    out = tmp_path / "index"
    res = runner.invoke(app, ["index", "--model", str(hyrec_dir), "--corpus", str(tiny_beir_dir), "--out", str(out),
                              "--kind", "hybrid", "--fusion", "sum", "--quiet"])
    assert res.exit_code == 0, res.output
    again = Retriever.load(out)
    assert again.hyrec and again.config.fusion.method == "sum"
    res = runner.invoke(app, ["search", "--index", str(out), QUERIES[0], "-k", "2"])
    assert res.exit_code == 0, res.output
    assert again.search(QUERIES[0], k=1).ids[0] in res.output
