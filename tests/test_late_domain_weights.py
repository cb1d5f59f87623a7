"""MaxSim re-ranking with a weight per domain (``MaxSimConfig.domain_weights``): each query's weight is the model's
own domain classifier's mix ``sum_k p_k w_k`` (checked by hand), all-zero weights keep the first stage and encode
no token vectors, all-one weights equal the one weight 1, a model without a classifier or with other domain names
is one clear error, and the same through ``medadapt eval`` / ``medadapt search --rerank-domain-weights``."""

from __future__ import annotations

import functools
import json
import re

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from typer.testing import CliRunner

from medadapt.adapters import attach
from medadapt.cache import EmbeddingCache
from medadapt.cli import app
from medadapt.domains import domain_probabilities
from medadapt.errors import ConfigError
from medadapt.moe import MoEConfig, MoEHead
from medadapt.retrieval.late import MaxSimConfig, MaxSimReranker, domain_classifier

pytestmark = pytest.mark.usefixtures("_single_thread", "_isolated_cache")

QUERIES = {"q1": "what causes gout", "q2": "glaucoma eye pressure", "q3": "the flu and coughing",
           "q4": "a rash on the arm"}
DOCS = {"a": "gout is a painful joint disease", "b": "what causes gout in the big toe",
        "c": "glaucoma raises eye pressure", "d": "the flu spreads by coughing"}
RUN = {q: {"a": 0.9, "b": 0.5, "c": 0.4, "d": 0.1} for q in QUERIES}
DIM = 32


def _pooled(tiny_bert_dir, texts) -> np.ndarray:
    """The plain backbone's pooled embeddings of ``texts`` (no Normalize), L2-normalised here, in float64."""
    plain = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    backbone = SentenceTransformer(modules=[plain[0], plain[1]], device="cpu")
    v = backbone.encode_query(list(texts), convert_to_numpy=True).astype(np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


@functools.cache
def _classifier_weights(tiny_bert_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-domain classifier that spreads the test queries: logit(a) - logit(b) = 2 s d.(v - m) within [-2, 2]
    (``d``: the first query's direction from the queries' mean ``m``)."""
    v = _pooled(tiny_bert_dir, QUERIES.values())
    m = v.mean(0)
    d = v[0] - m
    s = 1.0 / np.abs((v - m) @ d).max()
    weight = torch.tensor(np.stack([s * d, -s * d]), dtype=torch.float32)
    return weight, torch.tensor([-s * d @ m, s * d @ m], dtype=torch.float32)


def _domain_model(path, *, domains: bool = True) -> SentenceTransformer:
    """The tiny BERT with a MoE head whose correction is zero (the embedding is the backbone's) and, with
    ``domains``, a two-domain classifier (``a``, ``b``) over the frozen pooled embedding."""
    model = SentenceTransformer(str(path), device="cpu")
    head = MoEHead(MoEConfig.single_expert(DIM))  # zero_init_output: v + scale * 0 = v
    attach(model, head)
    if domains:
        head.set_domains(["a", "b"], [1.0, 1.0], *_classifier_weights(path))
    model.eval()
    return model


def _hand_probabilities(tiny_bert_dir, texts) -> np.ndarray:
    """softmax(W normalise(v) + b) over the plain backbone's pooled embedding ``v``, by hand."""
    weight, bias = (t.double().numpy() for t in _classifier_weights(tiny_bert_dir))
    logits = _pooled(tiny_bert_dir, texts) @ weight.T + bias
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _reranker(model, tmp_path, **options) -> MaxSimReranker:
    return MaxSimReranker(model, cache=EmbeddingCache(tmp_path / "c"), **options)


# --------------------------------------------------------------------------------------------------- the API
def test_each_query_gets_the_classifier_mix_of_the_domain_weights(tiny_bert_dir, tmp_path):
    model = _domain_model(tiny_bert_dir)
    weights = {"a": 0.2, "b": 0.9}
    r = _reranker(model, tmp_path, domain_weights=weights)
    assert r.classifier is model[2] and list(r.classifier.domain_names) == ["a", "b"]
    p = _hand_probabilities(tiny_bert_dir, QUERIES.values())
    hand = p @ np.array([weights["a"], weights["b"]])
    got = r.query_weights(list(QUERIES.values()))
    np.testing.assert_allclose(got, hand, atol=1e-5)
    assert np.ptp(got) > 0.05  # the queries do get different weights
    out = r.rerank(QUERIES, RUN, DOCS)
    for (qid, text), w in zip(QUERIES.items(), got):  # each query fused with its own weight
        single = _reranker(model, tmp_path, weight=float(w)).rerank({qid: text}, {qid: RUN[qid]}, DOCS)[qid]
        assert list(out[qid]) == list(single)
        np.testing.assert_allclose(list(out[qid].values()), list(single.values()), atol=1e-9)


def test_all_zero_domain_weights_keep_the_first_stage_and_encode_no_token_vectors(tiny_bert_dir, tmp_path):
    model = _domain_model(tiny_bert_dir)
    r = _reranker(model, tmp_path, domain_weights={"a": 0.0, "b": 0.0})
    out = r.rerank(QUERIES, RUN, DOCS)
    assert all(list(out[q]) == list(RUN[q]) for q in QUERIES)
    assert out == _reranker(model, tmp_path, weight=0.0).rerank(QUERIES, RUN, DOCS)
    assert r.tokens.encode_calls == 0
    assert not list((tmp_path / "c").glob("*/shard-*.safetensors"))  # no token vectors written either


def test_all_one_domain_weights_equal_the_single_weight_one(tiny_bert_dir, tmp_path):
    model = _domain_model(tiny_bert_dir)
    r = _reranker(model, tmp_path, domain_weights={"a": 1.0, "b": 1.0})
    assert r.query_weights(list(QUERIES.values())).tolist() == [1.0] * len(QUERIES)
    assert r.rerank(QUERIES, RUN, DOCS) == _reranker(model, tmp_path, weight=1.0).rerank(QUERIES, RUN, DOCS)


def test_zero_for_one_domain_leaves_only_the_other_domains_share(tiny_bert_dir, tmp_path):
    """With ``w_a = 0`` a query's weight is ``p_b * w_b``: the more the classifier gives it to ``a``, the closer it
    stays to its first-stage order."""
    model = _domain_model(tiny_bert_dir)
    r = _reranker(model, tmp_path, domain_weights={"a": 0.0, "b": 0.8})
    p = _hand_probabilities(tiny_bert_dir, QUERIES.values())
    np.testing.assert_allclose(r.query_weights(list(QUERIES.values())), 0.8 * p[:, 1], atol=1e-5)


@pytest.mark.parametrize("weights, message", [
    ({"a": 0.5}, "must name exactly the model's domains (a, b); missing: b"),
    ({"a": 0.5, "b": 0.1, "c": 0.2}, "must name exactly the model's domains (a, b); not the model's: c"),
    ({"medquad": 0.0, "questiondoctors": 0.7}, "(a, b); missing: a, b; not the model's: medquad, questiondoctors"),
])
def test_other_domain_names_are_one_error_naming_the_models_domains(tiny_bert_dir, weights, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        MaxSimReranker(_domain_model(tiny_bert_dir), domain_weights=weights)


def test_a_model_without_a_domain_classifier_is_one_error(tiny_bert, tiny_bert_dir):
    for model in (tiny_bert, _domain_model(tiny_bert_dir, domains=False)):  # no head; a head without domains
        assert domain_classifier(model) is None
        with pytest.raises(ConfigError, match="domain_weights needs a model with a domain classifier"):
            MaxSimReranker(model, domain_weights={"a": 0.5, "b": 0.5})
        MaxSimReranker(model, weight=0.5)  # one weight needs none


@pytest.mark.parametrize("options, message", [
    ({"domain_weights": {"a": 1.5, "b": 0.0}}, "domain_weights.a: Input should be less than or equal to 1"),
    ({"domain_weights": {"a": -0.1, "b": 0.0}}, "domain_weights.a: Input should be greater than or equal to 0"),
    ({"domain_weights": {}}, "domain_weights names no domain"),
    ({"domain_weights": {"a": 0.5, "b": 0.5}, "weight": 0.3}, "give weight or domain_weights, not both"),
])
def test_bad_domain_weights_are_one_config_error(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        MaxSimConfig.of(**options)


def test_the_hyrec_lexical_branch_exposes_its_classifier(tiny_bert_dir):
    from medadapt.hyrec.model import HyReCConfig, HyReCModel

    model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(branch_layers=1, language="en"))
    assert model.branch.domain_names == [] and domain_classifier(model.st) is None
    weight, bias = _classifier_weights(tiny_bert_dir)
    model.branch.set_domains(["a", "b"], [2.0, 0.5], weight, bias)
    assert domain_classifier(model.st) is model.branch and model.branch.domain_names == ["a", "b"]
    v = torch.randn(3, DIM)
    torch.testing.assert_close(model.branch.domain_probabilities(v),
                               domain_probabilities(model.branch.domain_classifier, v))
    # its frozen pooled embedding: the backbone's (Transformer + its CLS Pooling), before the dense projector
    backbone = SentenceTransformer(modules=[model.st[0], model.st[1]], device="cpu")
    pooled = torch.as_tensor(backbone.encode_query(list(QUERIES.values()), convert_to_numpy=True))
    p = torch.softmax(torch.nn.functional.normalize(pooled, dim=-1) @ weight.T + bias, -1).numpy()
    r = MaxSimReranker(model.st, domain_weights={"a": 0.0, "b": 1.0}, cache=EmbeddingCache(None))
    np.testing.assert_allclose(r.query_weights(list(QUERIES.values())), p[:, 1], atol=1e-5)


# --------------------------------------------------------------------------------------------------- the CLI
def _eval(*args):
    result = CliRunner().invoke(app, ["eval", *map(str, args), "--metrics", "ndcg@10,mrr@10,recall@10", "-q"])
    return result, [ln for ln in result.output.splitlines() if ln.strip()]


@pytest.fixture()
def domain_model_dir(tiny_bert_dir, tmp_path):
    _domain_model(tiny_bert_dir).save(str(tmp_path / "domain-model"))
    return tmp_path / "domain-model"


def test_cli_domain_weights_round_trip(domain_model_dir, tiny_beir_dir, tmp_path):
    common = ["--model", domain_model_dir, "--data", tiny_beir_dir, "--split", "test", "--cache-dir", tmp_path / "c",
              "--rerank", "maxsim", "--rerank-depth", "5"]
    runs = {"w0": ["--rerank-weight", "0"], "w1": ["--rerank-weight", "1"],
            "d0": ["--rerank-domain-weights", "a=0,b=0"], "d1": ["--rerank-domain-weights", " a = 1 , b=1"],
            "mix": ["--rerank-domain-weights", "a=0.2,b=0.9"]}
    for name, extra in runs.items():
        result, _ = _eval(*common, *extra, "--output", tmp_path / f"{name}.json")
        assert result.exit_code == 0, result.output
    scores = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in runs}
    assert scores["d0"] == scores["w0"] and scores["d1"] == scores["w1"] != scores["w0"]
    assert all(0.0 <= v <= 1.0 for v in scores["mix"].values())


@pytest.mark.parametrize("extra, message", [
    (["--rerank-domain-weights", "a=0.5"], ("error: maxsim re-ranking: domain_weights must name exactly the model's "
                                            "domains (a, b); missing: b")),
    (["--rerank-domain-weights", "a=0.5,b"], "error: --rerank-domain-weights takes NAME=WEIGHT pairs"),
    (["--rerank-domain-weights", "a=x,b=1"], "a's weight 'x' is not a number"),
    (["--rerank-domain-weights", "a=0.1,a=0.2"], "error: --rerank-domain-weights names 'a' twice"),
    (["--rerank-domain-weights", "a=2,b=0"], "error: maxsim re-ranking: domain_weights.a: Input should be less than"),
    (["--rerank-domain-weights", "a=1,b=1", "--rerank-weight", "0.5"],
     "error: --rerank-weight and --rerank-domain-weights: give one"),
])
def test_cli_bad_domain_weights_are_one_error_line(domain_model_dir, tiny_beir_dir, tmp_path, extra, message):
    result, lines = _eval("--model", domain_model_dir, "--data", tiny_beir_dir, "--cache-dir", tmp_path / "c",
                          "--rerank", "maxsim", *extra)
    assert result.exit_code != 0
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_cli_domain_weights_need_rerank_and_a_classifier(tiny_bert_dir, tiny_beir_dir, tmp_path):
    common = ["--data", tiny_beir_dir, "--cache-dir", tmp_path / "c"]
    result, lines = _eval("--model", tiny_bert_dir, *common, "--rerank-domain-weights", "a=1,b=0")
    assert result.exit_code != 0 and lines == ["error: --rerank-domain-weights applies with --rerank maxsim"]
    result, lines = _eval("--model", tiny_bert_dir, *common, "--rerank", "maxsim", "--rerank-domain-weights",
                          "a=1,b=0")
    assert result.exit_code != 0 and len(lines) == 1, lines
    assert lines[0].startswith("error: maxsim re-ranking: domain_weights needs a model with a domain classifier")


def test_cli_search_domain_weights(domain_model_dir, tiny_beir_dir, tmp_path):
    result = CliRunner().invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / "idx"),
                                      "--model", str(domain_model_dir), "-q"])
    assert result.exit_code == 0, result.output
    search = ["search", "--index", str(tmp_path / "idx"), "--queries", str(tiny_beir_dir), "--split", "test",
              "-k", "3", "-q", "--rerank", "maxsim"]
    one = CliRunner().invoke(app, [*search, "--rerank-weight", "1"])
    per_domain = CliRunner().invoke(app, [*search, "--rerank-domain-weights", "a=1,b=1"])
    assert one.exit_code == 0 and per_domain.exit_code == 0, per_domain.output
    assert per_domain.output == one.output
    bad = CliRunner().invoke(app, [*search, "--rerank-domain-weights", "a=1"])
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert bad.exit_code != 0 and len(lines) == 1 and "(a, b); missing: b" in lines[0], lines
