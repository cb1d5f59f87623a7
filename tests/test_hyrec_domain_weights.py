"""A fusion weight per domain for the learned-lexical branch on a ``data.mix`` (``eval.domain_weights``):
each domain's dense weight chosen on its dev split, given to every query by a domain classifier on the frozen
pooled embedding as a factor on its lexical vector (HyReCModel.lexical_query_scale)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import TOPICS, build_synonym_beir
from medadapt.errors import ConfigError
from medadapt.hyrec.model import HyReCConfig, HyReCModel

pytestmark = pytest.mark.usefixtures("_single_thread")


def _recipe(backbone, alpha, beta, **ev):
    return {
        "kind": "moe", "name": "mix-hybrid",
        "model": {"backbone": str(backbone), "freeze_backbone": True},
        "data": {"path": str(alpha), "train_split": "train", "mix": [{"path": str(beta)}]},
        "head": {"kind": "moe", "shared_experts": ["mlp_swiglu"], "routed_experts": [], "top_k": 0,
                 "expansion": 2, "domain_routing": True, "domain_scale_grid": [0.5, 1.0]},
        "loss": {"kind": "infonce", "temperature": 0.05, "load_balance_weight": 0.0},
        "training": {"shared_epochs": 10, "random_routing_epochs": 0, "epochs": 0, "batch_size": 4,
                     "lr": 3e-2, "warmup_ratio": 0.0, "seed": 0},
        "branches": [{
            "kind": "hyrec_lexical",
            "model": {"branch_layers": 1, "lexicon_layers": 1, "term_bias": True, "pooling": "mean",
                      "language": "en", "query_max_length": 16, "passage_max_length": 16},
            "negatives": {"source": "dense", "miner": "model", "window": [1, 4], "num": 1},
            "loss": {"temperature": 0.05, "lexical_weight": 1.0, "dense_weight": 0.0, "union_weight": 1.0},
            "training": {"epochs": 2, "batch_size": 4, "lr": 1e-2, "seed": 0, "state_cache": "memory",
                         "dense_inputs": "cache", "train_dense_encoder": False, "train_lexicon_encoder": False},
            "eval": {"modes": ["lexical", "dense", "hybrid"], "dense_source": "cache",
                     "tune_dense_weight": [0.25, 1.0, 4.0], **ev}}],
        "eval": {"split": "test", "metrics": ["ndcg@10"], "also": [{"data": str(beta), "split": "test"}],
                 "peers": ["linear_query"]},
    }


def test_the_query_scale_is_the_dense_weight_over_the_mixed_domain_weights(tiny_bert_dir):
    """Hand computation: classifier weight 0 and bias (log 3, 0) give every query p = (0.75, 0.25); domain
    weights (2, 0.5) and dense_weight 1 give c = 0.75 / 2 + 0.25 / 0.5 = 0.875, and the query's lexical vector
    (unit norm without domains) then has norm 0.875; documents are not scaled."""
    model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(branch_layers=1, language="en"))
    texts = ["fever and cough", "a rash on the arm"]
    lex_q = model.encode_lexical(texts, "query")
    lex_d = model.encode_lexical(texts, "document")
    dim = model.auto_model.config.hidden_size
    model.branch.set_domains(["a", "b"], [2.0, 0.5], torch.zeros(2, dim), torch.tensor([math.log(3.0), 0.0]))
    scale = model.lexical_query_scale(torch.randn(3, dim))
    torch.testing.assert_close(scale, torch.full((3,), 0.875))
    scaled = model.encode_lexical(texts, "query")
    for before, after in zip(lex_q, scaled):
        assert after.keys() == before.keys()
        assert all(after[t] == pytest.approx(0.875 * w) for t, w in before.items())
    assert model.encode_lexical(texts, "document") == lex_d
    with pytest.raises(ValueError, match="dense weight > 0"):
        model.branch.set_domains(["a", "b"], [2.0, 0.0], torch.zeros(2, dim), torch.zeros(2))


def test_a_confident_query_ranks_as_its_domains_own_dense_weight(tiny_bert_dir, tmp_path):
    """With the classifier sure of domain a (bias 50), the sum fusion ``c * lexical + 1 * dense`` gives the
    hybrid scores of the plain model at dense weight w_a, divided by w_a: the same ranking and metrics."""
    from medadapt.hyrec.evaluate import evaluate_hyrec

    data = build_synonym_beir(tmp_path / "syn", 2)
    model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(branch_layers=1, language="en"))
    model.config.dense_weight = 4.0
    plain, runs = evaluate_hyrec(model, data, "test", "hybrid", ["ndcg@10", "mrr@10"], show_progress=False,
                                 return_runs=True)
    dim = model.auto_model.config.hidden_size
    model.branch.set_domains(["a", "b"], [4.0, 0.25], torch.zeros(2, dim), torch.tensor([50.0, 0.0]))
    assert model.config.dense_weight == 1.0
    routed, runs2 = evaluate_hyrec(model, data, "test", "hybrid", ["ndcg@10", "mrr@10"], show_progress=False,
                                   return_runs=True)
    assert routed == pytest.approx(plain)
    for q, docs in runs["hybrid"].items():
        assert runs2["hybrid"][q] == pytest.approx({d: v / 4.0 for d, v in docs.items()}, abs=1e-5)


def test_a_config_without_domains_serialises_as_before():
    """Index fingerprints hash the config dict: without domains it has exactly the keys it had before."""
    out = HyReCConfig().to_dict()
    assert "domains" not in out and "domain_dense_weights" not in out
    both = HyReCConfig(domains=["a", "b"], domain_dense_weights=[1.0, 2.0]).to_dict()
    assert HyReCConfig.from_dict(both) == HyReCConfig(domains=["a", "b"], domain_dense_weights=[1.0, 2.0])


def test_mix_run_chooses_a_weight_per_domain_and_the_folder_reloads_it(tiny_bert_dir, tmp_path, monkeypatch):
    import medadapt
    from medadapt.recipes import load_recipe, run_recipe
    from medadapt.retrieval.encoders import as_encoder

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    alpha = build_synonym_beir(tmp_path / "alpha", 2, dev=True)
    beta = build_synonym_beir(tmp_path / "beta", 3, TOPICS[: len(TOPICS) // 2], dev=True)
    out = tmp_path / "run"
    result = run_recipe(load_recipe(_recipe(tiny_bert_dir, alpha, beta, domain_weights=True)), out,
                        show_progress=False, log=lambda _m: None)
    tuning = json.loads((out / "train_log.json").read_text())["dense_weight_tuning"]
    assert set(tuning["chosen"]) == {"alpha", "beta"}
    for name, chosen in tuning["chosen"].items():  # each domain's weight is its own dev argmax
        curve = {float(w): s for w, s in tuning["ndcg@10"][name].items()}
        assert curve[chosen] == max(curve.values())
    assert "hybrid/ndcg@10" in result.metrics
    # the same-run peer (a dense model) sits beside the dense rows of the card, for the eval split and the also set
    peer = json.loads((out / "metrics.json").read_text())["peers"]["linear query adapter"]
    card = (out / "README.md").read_text()
    dense_row = next(ln for ln in card.splitlines() if ln.startswith("| dense/ndcg@10 |"))
    assert f"{peer['ndcg@10']:.4f}" in dense_row
    also_row = next(ln for ln in card.splitlines() if ln.startswith("| beta/test | dense/ndcg@10 |"))
    assert f"{peer['also']['beta/test']['ndcg@10']:.4f}" in also_row
    model = as_encoder(medadapt.load(out, device="cpu"))
    assert model.config.domains == ["alpha", "beta"] and model.config.dense_weight == 1.0
    assert model.config.domain_dense_weights == [tuning["chosen"]["alpha"], tuning["chosen"]["beta"]]
    queries = ["symptoms of fever", "treatment of rash"]
    dense, lex = model.encode(queries, "query")
    again = as_encoder(medadapt.load(out, device="cpu")).encode(queries, "query")
    assert np.array_equal(dense, again[0]) and lex == again[1]
    for vec in lex:  # the query's lexical norm is its classifier-mixed scale, between the two domains'
        norm = math.sqrt(sum(w * w for w in vec.values()))
        lo, hi = sorted(1.0 / w for w in model.config.domain_dense_weights)
        assert lo - 1e-5 <= norm <= hi + 1e-5


def test_domain_weights_need_a_mix_and_positive_weights(tiny_bert_dir, tmp_path):
    from medadapt.recipes import load_recipe

    alpha = build_synonym_beir(tmp_path / "alpha", 2, dev=True)
    bad = _recipe(tiny_bert_dir, alpha, alpha, domain_weights=True, tune_dense_weight=[0.0, 1.0])
    with pytest.raises(ConfigError, match="weights > 0"):
        load_recipe(bad)
