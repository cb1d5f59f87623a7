"""A HyReC model inside the RAG Retriever: learned sparse vectors in the inverted index, dense vectors in
FAISS, NM-sum hybrid, save -> load, model mismatch, LangChain."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medadapt.errors import MedAdaptError
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
    assert r.learned_sparse and r.lexical.kind == "sparse" and r.dense is None
    assert isinstance(r.encoder, HyReCModel) and r.manifest.encoder == "hyrec"
    from medadapt.retrieval.encoders import HybridEncoder, offers_sparse

    assert isinstance(model, HybridEncoder) and offers_sparse(str(hyrec_dir))
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
        assert score == pytest.approx(lex.get(doc_id, 0.0) + 0.5 * float(dvec[i] @ q_dense), abs=1e-5)

    # shallow lists: each candidate is still scored exactly (no floor for a document missing from a list)
    r.config = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=0.5, depth=2))
    shallow = r.search(QUERIES[0], k=3)
    assert 2 <= len(shallow) <= 3
    for doc_id, score in zip(shallow.ids, shallow.scores):
        i = docs.ids.index(doc_id)
        assert score == pytest.approx(lex.get(doc_id, 0.0) + 0.5 * float(dvec[i] @ q_dense), abs=1e-5)
    r.config = cfg

    r.save(tmp_path / "index")
    again = Retriever.load(tmp_path / "index")  # reloads the HyReC model from its recorded folder
    assert again.learned_sparse and again.manifest.encoder == "hyrec"
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
    assert again.learned_sparse and again.config.fusion.method == "sum"
    res = runner.invoke(app, ["search", "--index", str(out), QUERIES[0], "-k", "2"])
    assert res.exit_code == 0, res.output
    assert again.search(QUERIES[0], k=1).ids[0] in res.output


def test_the_models_tuned_fusion_is_the_default_of_index_and_retriever(hyrec_dir, tiny_beir_dir, tmp_path):
    """A HyReC folder carries the dense_weight it was trained or tuned with; ``medadapt index`` and
    ``Retriever.build`` without fusion settings serve exactly that (its NM sum), explicit options win."""
    from typer.testing import CliRunner

    from medadapt.cli import app

    model = HyReCModel.load(hyrec_dir)
    model.config.dense_weight = 0.25  # as `eval.tune_dense_weight` would leave it
    model.save(tmp_path / "tuned")
    tuned = tmp_path / "tuned"
    docs = load_documents(tiny_beir_dir)
    assert Retriever.build(docs, model=str(tuned), kind="hybrid", show_progress=False).config.fusion.model_dump(
        include={"method", "dense_weight"}) == {"method": "sum", "dense_weight": 0.25}
    runner = CliRunner()
    for extra, want in (([], ("sum", 0.25)), (["--dense-weight", "2"], ("sum", 2.0)),
                        (["--fusion", "minmax"], ("minmax", 0.25))):
        out = tmp_path / f"index{len(extra)}{extra[:1]}"
        res = runner.invoke(app, ["index", "--model", str(tuned), "--corpus", str(tiny_beir_dir), "--out", str(out),
                                  "--kind", "hybrid", "--quiet", *extra])
        assert res.exit_code == 0, res.output
        fusion = Retriever.load(out).config.fusion
        assert (fusion.method, fusion.dense_weight) == want, extra


def test_retriever_hybrid_ranks_like_evaluate_hyrec(hyrec_dir, tiny_beir_dir):
    """One hybrid score: the Retriever's ``sum`` fusion with the model's dense_weight and evaluate_hyrec's
    NM sum give the same ranking (and scores) for the same queries."""
    from medadapt.data import load_beir
    from medadapt.hyrec.evaluate import evaluate_hyrec

    model = HyReCModel.load(hyrec_dir)
    model.config.dense_weight = 0.25  # not 1, so a convex or a lexical-weighted reading would rank differently
    data = load_beir(tiny_beir_dir, ["test"])
    _, runs = evaluate_hyrec(model, data, "test", "hybrid", ["ndcg@10"], show_progress=False, return_runs=True)
    docs = load_documents(tiny_beir_dir)
    cfg = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=model.config.dense_weight))
    r = Retriever.build(docs, model=model, config=cfg, show_progress=False)
    queries = data.split_queries("test")
    results = r.batch_search(list(queries.values()), k=len(docs))
    for qid, res in zip(queries, results):
        expected = runs["hybrid"][qid]
        assert res.ids == list(expected)
        np.testing.assert_allclose(res.scores, list(expected.values()), rtol=1e-5, atol=1e-6)
    # the lexical side matters: with a different weight the order changes for some query
    r.config = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=4.0))
    assert [x.ids for x in r.batch_search(list(queries.values()), k=len(docs))] != [x.ids for x in results]


def test_index_folder_of_format_1_loads_with_the_same_ranking(hyrec_dir, tiny_beir_dir, tmp_path):
    """Format 1 stored dense_weight as the convex share w (w * dense + (1 - w) * lexical); on load it becomes
    w / (1 - w), which ranks the same, with scores divided by (1 - w)."""
    import json

    docs = load_documents(tiny_beir_dir)
    share = 0.2
    cfg = RetrieverConfig(kind="hybrid", fusion=FusionConfig(method="sum", dense_weight=share / (1 - share)))
    r = Retriever.build(docs, model=str(hyrec_dir), config=cfg, show_progress=False)
    want = r.batch_search(QUERIES, k=len(docs))
    r.save(tmp_path / "index")
    path = tmp_path / "index" / "manifest.json"
    manifest = json.loads(path.read_text())
    assert manifest["format"] == 3
    (tmp_path / "index" / "manifest.sha256").unlink()  # format 1 predates the manifest checksum
    manifest["format"] = 1
    manifest["config"]["fusion"]["dense_weight"] = share  # what the earlier version wrote
    path.write_text(json.dumps(manifest))
    old = Retriever.load(tmp_path / "index")
    assert old.config.fusion.dense_weight == pytest.approx(0.25)
    got = old.batch_search(QUERIES, k=len(docs))
    assert [x.ids for x in got] == [x.ids for x in want]
    np.testing.assert_allclose([x.scores for x in got], [x.scores for x in want], rtol=1e-5)
    old.save(tmp_path / "again")  # saved again in the current format
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["format"] == 3
    manifest["config"]["fusion"]["dense_weight"] = 1.0  # the dense side alone: not expressible any more
    path.write_text(json.dumps(manifest))
    with pytest.raises(MedAdaptError, match="dense side alone"):
        Retriever.load(tmp_path / "index")
