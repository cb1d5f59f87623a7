from __future__ import annotations

import math

import numpy as np
import pytest

from medadapt.data import load_beir
from medadapt.data.rerank import RerankItem
from medadapt.data.sts import StsPair
from medadapt.errors import MedAdaptError
from medadapt.eval import (
    evaluate_rerank,
    evaluate_retrieval,
    evaluate_run,
    evaluate_sts,
    exact_search,
    parse_metric,
)

QRELS = {"a": {"d1": 1, "d2": 2}, "b": {"d3": 1}}
RUN = {"a": {"d1": 1.0, "d9": 2.0, "d2": 0.5}, "b": {"d7": 3.0, "d3": 2.0}}


def test_metrics_match_hand_computation():
    r = evaluate_run(QRELS, RUN, ["ndcg@10", "recall@1", "mrr@10", "mrr@1", "precision@2", "f1@2", "accuracy@1",
                                  "accuracy@2", "map@10"])
    # query a: ranking d9(0) d1(1) d2(2); ideal d2(2) d1(1); trec_eval's gain is the grade itself
    dcg_a = 1 / math.log2(3) + 2 / math.log2(4)
    idcg_a = 2 / math.log2(2) + 1 / math.log2(3)
    dcg_b, idcg_b = 1 / math.log2(3), 1.0
    assert r["ndcg@10"] == pytest.approx((dcg_a / idcg_a + dcg_b / idcg_b) / 2)
    assert r["mrr@10"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert r["mrr@1"] == 0.0
    assert r["recall@1"] == 0.0
    assert r["precision@2"] == pytest.approx((0.5 + 0.5) / 2)
    # f1@2: a: P=.5 R=.5 -> .5 ; b: P=.5 R=1 -> 2/3
    assert r["f1@2"] == pytest.approx((0.5 + 2 / 3) / 2)
    assert r["accuracy@1"] == 0.0 and r["accuracy@2"] == 1.0
    assert r["map@10"] == pytest.approx(((1 / 2 + 2 / 3) / 2 + 1 / 2) / 2)
    # cut-offs that cut: nDCG@2 of a keeps d9 d1 (DCG 1/log2 3; the ideal top 2 is d2 d1), b keeps d7 d3
    cut = evaluate_run(QRELS, RUN, ["ndcg@1", "ndcg@2"])
    assert cut["ndcg@1"] == 0.0  # d9 and d7 are not relevant
    assert cut["ndcg@2"] == pytest.approx(((1 / math.log2(3)) / idcg_a + (1 / math.log2(3)) / idcg_b) / 2)


def test_missing_query_in_run_counts_as_zero():
    r = evaluate_run(QRELS, {"a": RUN["a"]}, ["recall@100"])
    assert r["recall@100"] == pytest.approx(0.5)


@pytest.mark.parametrize("bad", ["ndcg", "ndcg@0", "foo@10", "ndcg@x"])
def test_bad_metric_names(bad):
    with pytest.raises(ValueError):
        parse_metric(bad)


def test_exact_search_equals_brute_force():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=(37, 16)).astype("float32"), rng.normal(size=(500, 16)).astype("float32")
    scores, idx = exact_search(q, d, k=7, query_chunk=10)
    full = q @ d.T
    np.testing.assert_array_equal(idx, np.argsort(-full, axis=1)[:, :7])
    np.testing.assert_allclose(scores, np.take_along_axis(full, idx, 1), rtol=1e-5)
    with pytest.raises(ValueError, match="dimension mismatch"):
        exact_search(q, d[:, :8], 3)


def test_evaluate_retrieval_independent_pytrec(tiny_bert, tiny_beir_dir, tmp_path):
    import pytrec_eval

    from medadapt.cache import EmbeddingCache

    data = load_beir(tiny_beir_dir, "test")
    res, run = evaluate_retrieval(tiny_bert, data, "test", ["ndcg@10", "recall@100"], cache=EmbeddingCache(tmp_path),
                                  show_progress=False, return_run=True)
    # independent computation: brute-force cosine ranking + pytrec_eval directly
    qids = list(data.qrels["test"])
    q = tiny_bert.encode_query([data.queries[i] for i in qids])
    d = tiny_bert.encode_document(data.doc_texts())
    sims = q @ d.T
    ref_run = {qid: {did: float(s) for did, s in zip(data.doc_ids, sims[i])} for i, qid in enumerate(qids)}
    ev = pytrec_eval.RelevanceEvaluator(data.qrels["test"], {"ndcg_cut.10"}).evaluate(ref_run)
    assert res["ndcg@10"] == pytest.approx(np.mean([v["ndcg_cut_10"] for v in ev.values()]), abs=1e-6)
    assert res["recall@100"] == pytest.approx(1.0)
    assert set(run) == set(qids)


def test_rerank_and_sts(tiny_bert):
    items = [
        RerankItem("diabetes thirst", ["diabetes blood sugar thirst", "asthma inhaler", "gout toe"], [2, 0, 0]),
        RerankItem("asthma wheezing", ["eczema itchy", "asthma wheezing inhaler"], [0, 1]),
    ]
    r = evaluate_rerank(tiny_bert, items)
    # by hand: rank each item's candidates by cosine, then MRR, AP and linear-gain nDCG (pytrec_eval's)
    mrr, ap, ndcg = [], [], []
    for it in items:
        q = tiny_bert.encode_query([it.query])[0]
        d = tiny_bert.encode_document(it.texts)
        cos = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
        grades = [it.grades[j] for j in np.argsort(-cos, kind="stable")]
        hits = [i for i, g in enumerate(grades) if g > 0]
        mrr.append(1 / (hits[0] + 1))
        ap.append(np.mean([(n + 1) / (i + 1) for n, i in enumerate(hits)]))
        dcg = sum(g / np.log2(i + 2) for i, g in enumerate(grades))
        ideal = sum(g / np.log2(i + 2) for i, g in enumerate(sorted(it.grades, reverse=True)))
        ndcg.append(dcg / ideal)
    assert r["mrr@10"] == pytest.approx(np.mean(mrr), abs=1e-6)
    assert r["map@10"] == pytest.approx(np.mean(ap), abs=1e-6)
    assert r["ndcg@10"] == pytest.approx(np.mean(ndcg), abs=1e-6)
    pairs = [StsPair("diabetes", "diabetes", 5.0), StsPair("diabetes", "asthma inhaler wheezing", 0.0),
             StsPair("gout toe", "gout uric acid toe", 4.0), StsPair("insomnia", "eczema rash", 0.5)]
    s = evaluate_sts(tiny_bert, pairs)
    from scipy.stats import pearsonr, spearmanr

    a = tiny_bert.encode([p.sentence1 for p in pairs], normalize_embeddings=True)
    b = tiny_bert.encode([p.sentence2 for p in pairs], normalize_embeddings=True)
    cos, gold = (a * b).sum(1), [p.score for p in pairs]
    assert s["pearson"] == pytest.approx(pearsonr(cos, gold)[0], abs=1e-5)
    assert s["spearman"] == pytest.approx(spearmanr(cos, gold)[0], abs=1e-9)
    with pytest.raises(ValueError, match="constant"):
        evaluate_sts(tiny_bert, [StsPair("a", "b", 1.0), StsPair("c", "d", 1.0)])


def test_plot_and_json(tmp_path):
    import json

    from medadapt.eval import plot_results, write_json

    write_json(tmp_path / "r.json", {"ndcg@10": 0.5})
    assert json.loads((tmp_path / "r.json").read_text()) == {"ndcg@10": 0.5}
    png = plot_results({"a": {"ndcg@10": 0.5, "recall@100": 0.9}, "b": {"ndcg@10": 0.6}}, tmp_path / "p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


STS_PAIRS = [StsPair("diabetes", "diabetes thirst", 5.0), StsPair("diabetes", "asthma inhaler wheezing", 0.0),
             StsPair("gout toe", "gout uric acid toe", 4.0), StsPair("insomnia", "eczema rash", 0.5),
             StsPair("asthma", "asthma wheezing inhaler", 4.5), StsPair("gout", "blood sugar", 1.0)]


def _pearson(a, b):
    from scipy.stats import pearsonr

    return pearsonr(a, b)[0]


def test_sts_is_cosine_even_for_a_dot_product_model(tiny_bert_dir):
    """BMRetriever-style models declare the dot product for retrieval; STS is scored by cosine (the papers),
    the model's own similarity only on request."""
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    dot_model = SentenceTransformer(modules=list(full._modules.values())[:2], device="cpu",
                                    similarity_fn_name="dot")  # no Normalize: norms differ per text
    a = dot_model.encode([p.sentence1 for p in STS_PAIRS])
    b = dot_model.encode([p.sentence2 for p in STS_PAIRS])
    gold = [p.score for p in STS_PAIRS]
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    dot = (a * b).sum(1)
    assert abs(_pearson(cos, gold) - _pearson(dot, gold)) > 1e-3  # the choice matters on this data
    assert evaluate_sts(dot_model, STS_PAIRS)["pearson"] == pytest.approx(_pearson(cos, gold), abs=1e-5)
    assert evaluate_sts(dot_model, STS_PAIRS, similarity="model")["pearson"] == pytest.approx(
        _pearson(dot, gold), abs=1e-5)
    assert evaluate_sts(dot_model, STS_PAIRS, similarity="dot")["pearson"] == pytest.approx(
        _pearson(dot, gold), abs=1e-5)


def test_sts_on_an_asymmetric_model_uses_one_named_route(tmp_path):
    """Both sentences through the query tower by default (not the Router's silent default route), or through
    the document tower when asked."""
    from conftest import build_tiny_bert
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Router

    q_st = SentenceTransformer(str(build_tiny_bert(tmp_path / "q", seed=1)), device="cpu")
    d_st = SentenceTransformer(str(build_tiny_bert(tmp_path / "d", seed=2)), device="cpu")
    router = Router.for_query_document(query_modules=list(q_st._modules.values())[:-1],
                                       document_modules=list(d_st._modules.values())[:-1])
    asym = SentenceTransformer(modules=[router, Normalize()], device="cpu")
    by_query, by_doc = evaluate_sts(q_st, STS_PAIRS), evaluate_sts(d_st, STS_PAIRS)
    assert abs(by_query["pearson"] - by_doc["pearson"]) > 1e-3
    assert evaluate_sts(asym, STS_PAIRS)["pearson"] == pytest.approx(by_query["pearson"], abs=1e-5)
    assert evaluate_sts(asym, STS_PAIRS, route="document")["pearson"] == pytest.approx(by_doc["pearson"], abs=1e-5)
    with pytest.raises(MedAdaptError, match="route must be query or document"):
        evaluate_sts(asym, STS_PAIRS, route="both")
