"""Domain routing of a MoE head (medadapt.moe.domains, MoEHead.scale_for): a residual scale per domain of a
``data.mix``, chosen on dev, given to each input by a linear domain classifier."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from conftest import TOPICS, build_synonym_beir
from medadapt.errors import ConfigError
from medadapt.moe.config import MoEConfig
from medadapt.moe.domains import fit_domain_classifier
from medadapt.moe.head import MoEHead
from medadapt.moe.schedule import head_training

pytestmark = pytest.mark.usefixtures("_single_thread")


def _trained_looking_head(dim: int = 8) -> MoEHead:
    torch.manual_seed(0)
    head = MoEHead(MoEConfig.single_expert(dim, zero_init_output=False))
    head.eval()
    return head


def test_scale_is_the_classifier_probabilities_times_the_domain_scales():
    head = _trained_looking_head()
    v = torch.randn(5, 8)
    with torch.no_grad():
        full = head.transform(v) - v  # h (residual_scale 1)
        # weight 0, bias (log 3, 0): every row is 3:1 for domain a -> gamma = 0.75 * 1.0 + 0.25 * 0.2 = 0.8
        head.set_domains(["a", "b"], [1.0, 0.2], torch.zeros(2, 8), torch.tensor([math.log(3.0), 0.0]))
        torch.testing.assert_close(head.transform(v), v + 0.8 * full)
        torch.testing.assert_close(head.domain_probabilities(v), torch.tensor([[0.75, 0.25]] * 5))
        head.domain_routing = False  # run-time switch: back to the one residual scale
        head.residual_scale = 0.5
        torch.testing.assert_close(head.transform(v), v + 0.5 * full)


def test_training_uses_the_full_correction_and_restores_domain_routing():
    head = _trained_looking_head()
    head.set_domains(["a", "b"], [0.2, 0.2], torch.zeros(2, 8), torch.zeros(2))
    v = torch.randn(3, 8)
    with torch.no_grad():
        with head_training(head):
            assert head.domain_routing is False
            inside = head.transform(v)
        assert head.domain_routing is True
        outside = head.transform(v)
    torch.testing.assert_close(outside - v, 0.2 * (inside - v))


def test_domain_routing_is_saved_and_loaded_with_the_head(tmp_path):
    head = _trained_looking_head()
    weight = torch.randn(2, 8)
    head.set_domains(["medquad", "questiondoctors"], [1.0, 0.4], weight, torch.tensor([0.1, -0.1]))
    head.save(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["domains"] == ["medquad", "questiondoctors"] and config["domain_scales"] == [1.0, 0.4]
    loaded = MoEHead.load(str(tmp_path))
    loaded.eval()
    v = torch.randn(6, 8)
    with torch.no_grad():
        assert torch.equal(loaded.transform(v), head.transform(v))
    assert torch.equal(loaded.domain_router.weight, weight)
    assert not any(p.requires_grad for p in loaded.domain_router.parameters())  # fitted, not trained


def test_a_head_saved_without_domains_still_loads(tmp_path):
    head = _trained_looking_head()
    head.save(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    for key in ("domains", "domain_scales"):  # a folder written before domain routing existed
        config.pop(key)
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = MoEHead.load(str(tmp_path))
    assert loaded.domain_router is None and loaded.config.domains == []


@pytest.mark.parametrize("kwargs, message", [
    ({"domains": ["a", "b"], "domain_scales": [1.0]}, "same length"),
    ({"domains": ["a", "a"], "domain_scales": [1.0, 0.5]}, "distinct"),
    ({"domains": ["a"], "domain_scales": [1.0]}, "at least two"),
    ({"domains": ["a", "b"], "domain_scales": [1.0, 1.5]}, r"in \[0, 1\]"),
    ({"domains": ["a", "b"], "domain_scales": [1.0, float("nan")]}, r"in \[0, 1\]"),
    ({"domains": ["a", "b"], "domain_scales": [1.0, 0.5], "residual": False}, "residual=True"),
])
def test_bad_domain_config_is_one_clear_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MoEConfig.single_expert(8, **kwargs)


def test_domain_classifier_separates_domains_and_is_deterministic():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 16))
    feats = [centres[k] + 0.3 * rng.normal(size=(40 + 10 * k, 16)) for k in range(3)]
    w1, b1, acc = fit_domain_classifier(feats)
    w2, b2, _ = fit_domain_classifier(feats)
    assert acc == 1.0 and torch.equal(w1, w2) and torch.equal(b1, b2)
    x = torch.nn.functional.normalize(torch.as_tensor(centres, dtype=torch.float32), dim=-1)
    assert (x @ w1.T + b1).argmax(-1).tolist() == [0, 1, 2]
    with pytest.raises(ValueError, match="two domains"):
        fit_domain_classifier(feats[:1])


def _mix_recipe(backbone, alpha, beta, **head):
    return {
        "kind": "moe", "name": "mix",
        "model": {"backbone": str(backbone), "freeze_backbone": True},
        "data": {"path": str(alpha), "train_split": "train", "mix": [{"path": str(beta)}]},
        "head": {"kind": "moe", "shared_experts": ["mlp_swiglu"], "routed_experts": [], "top_k": 0,
                 "expansion": 2, **head},
        "loss": {"kind": "infonce", "temperature": 0.05, "load_balance_weight": 0.0},
        "training": {"shared_epochs": 30, "random_routing_epochs": 0, "epochs": 0, "batch_size": 4,
                     "lr": 3e-2, "warmup_ratio": 0.0, "seed": 0},
        "eval": {"split": "test", "metrics": ["ndcg@10"], "also": [{"data": str(beta), "split": "test"}]},
    }


def test_mix_recipe_with_domain_routing_records_the_choice_and_reloads(tiny_bert_dir, tmp_path, monkeypatch):
    import medadapt
    from medadapt.recipes import load_recipe, run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    alpha = build_synonym_beir(tmp_path / "alpha", 2, dev=True)
    beta = build_synonym_beir(tmp_path / "beta", 3, TOPICS[: len(TOPICS) // 2], dev=True)
    out = tmp_path / "run"
    recipe = load_recipe(_mix_recipe(tiny_bert_dir, alpha, beta, domain_routing=True,
                                     domain_scale_grid=[0.5, 1.0]))
    result = run_recipe(recipe, out, show_progress=False, log=lambda _m: None)
    routing = json.loads((out / "train_log.json").read_text())["domain_routing"]
    assert routing["domains"] == ["alpha", "beta"]
    assert set(routing["scales"].values()) <= {0.5, 1.0}
    assert set(routing["dev_ndcg@10"]["alpha"]) == {"0.5", "1"}
    for name in ("alpha", "beta"):  # the chosen scale is the dev argmax (ties: the smaller one)
        dev = {float(g): s for g, s in routing["dev_ndcg@10"][name].items()}
        assert dev[routing["scales"][name]] == max(dev.values())
    base = json.loads((out / "baseline_metrics.json").read_text())
    assert result.metrics["ndcg@10"] > base["ndcg@10"] + 0.05
    also = json.loads((out / "metrics.json").read_text())["also"]["beta/test"]
    assert also["trained"]["ndcg@10"] > also["base"]["ndcg@10"] + 0.05
    model = medadapt.load(out, device="cpu")
    head = next(m for m in model.modules() if isinstance(m, MoEHead))
    assert head.config.domains == ["alpha", "beta"] and head.domain_routing
    texts = ["symptoms of a", "b is a condition"]
    assert np.array_equal(model.encode(texts), medadapt.load(out, device="cpu").encode(texts))


def test_domain_routing_without_a_mix_is_one_clear_error(tiny_bert_dir, tmp_path):
    from medadapt.recipes import load_recipe

    alpha = build_synonym_beir(tmp_path / "alpha", 2, dev=True)
    data = _mix_recipe(tiny_bert_dir, alpha, alpha, domain_routing=True)
    data["data"].pop("mix")
    with pytest.raises(ConfigError, match="needs data.mix"):
        load_recipe(data)
    with pytest.raises(ConfigError, match="domain_scale_grid"):
        load_recipe(_mix_recipe(tiny_bert_dir, alpha, alpha, domain_scale_grid=[1.5]))


def test_default_grid_keeps_a_domain_the_head_hurts_frozen(tiny_bert_dir, tmp_path, monkeypatch):
    """The default grid runs 0 ... 0.5: a domain whose dev score only falls with the scale gets 0 (the frozen
    embedding), one whose dev score keeps rising gets the cap 0.5, never the full correction."""
    import medadapt
    from medadapt.moe import domains as routing_module
    from medadapt.moe.config import DOMAIN_SCALE_GRID
    from medadapt.recipes import load_recipe, run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    alpha = build_synonym_beir(tmp_path / "alpha", 2, dev=True)
    beta = build_synonym_beir(tmp_path / "beta", 3, TOPICS[: len(TOPICS) // 2], dev=True)
    real = routing_module.evaluate_retrieval
    seen = []

    def scored(model, data, split, metrics, **kw):  # alpha gains with the scale, beta loses with it
        head = next(m for m in model.modules() if isinstance(m, MoEHead))
        seen.append((data.root.name, head.residual_scale))
        sign = 1.0 if data.root.name == "alpha" else -1.0
        return {"ndcg@10": 0.5 + sign * head.residual_scale}

    monkeypatch.setattr(routing_module, "evaluate_retrieval", scored)
    recipe = load_recipe(_mix_recipe(tiny_bert_dir, alpha, beta, domain_routing=True))
    run_recipe(recipe, tmp_path / "run", show_progress=False, evaluate=False, log=lambda _m: None)
    monkeypatch.setattr(routing_module, "evaluate_retrieval", real)
    assert sorted({g for _, g in seen}) == sorted(DOMAIN_SCALE_GRID) and max(DOMAIN_SCALE_GRID) == 0.5
    routing = json.loads((tmp_path / "run" / "train_log.json").read_text())["domain_routing"]
    assert routing["scales"] == {"alpha": 0.5, "beta": 0.0}
    head = next(m for m in medadapt.load(tmp_path / "run", device="cpu").modules() if isinstance(m, MoEHead))
    assert head.config.domain_scales == [0.5, 0.0]
