"""The linear heads (``linear``: identity-initialised W e; ``search_adaptor``: e + s W e) and query-only heads
on a one-tower model (medadapt.adapters.linear, medadapt.adapters.api.split_routes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

import medadapt
from medadapt.adapters.api import shared_backbone
from medadapt.errors import ConfigError
from medadapt.adapters.linear import LinearHead, LinearHeadConfig, SearchAdaptorConfig, SearchAdaptorHead
from medadapt.losses.drift import DriftLoss

pytestmark = pytest.mark.usefixtures("_single_thread")

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "linear-query-demo.yaml"
TEXTS = ["symptoms of gout", "asthma treatment with an inhaler", "what causes anemia"]
CONFIGS = [LinearHeadConfig(), LinearHeadConfig(bias=True), SearchAdaptorConfig(),
           SearchAdaptorConfig(bias=True, scale=0.5, drift_weight=0.3)]


def _load(path):
    return medadapt.load(str(path), device="cpu")


def _enc(model, role):
    fn = model.encode_query if role == "query" else model.encode_document
    return np.asarray(fn(TEXTS))


def _perturb(head, seed=0):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.kind}-bias{c.bias}")
def test_untrained_head_returns_the_frozen_embedding_exactly(tiny_bert_dir, config):
    model = _load(tiny_bert_dir)
    frozen = {role: _enc(model, role) for role in ("query", "document")}
    head = model.add_adapter(config, adapter_name="h")
    v = torch.randn(5, head.dim)
    assert torch.equal(head({"sentence_embedding": v.clone()})["sentence_embedding"], v)
    for role in ("query", "document"):
        np.testing.assert_array_equal(_enc(model, role), frozen[role])


def test_outputs_by_hand():
    v = torch.tensor([[1.0, 2.0], [-3.0, 0.5]])
    w, b = torch.tensor([[2.0, -1.0], [0.5, 3.0]]), torch.tensor([0.25, -1.0])
    linear = LinearHead(2, bias=True)
    adaptor = SearchAdaptorHead(2, bias=True, scale=0.5)
    for head in (linear, adaptor):
        with torch.no_grad():
            head.linear.weight.copy_(w)
            head.linear.bias.copy_(b)
    # W v + b: row 1 = (2*1 - 1*2 + 0.25, 0.5*1 + 3*2 - 1) = (0.25, 5.5); row 2 = (-6.5 + 0.25, -1.5 + 1.5 - 1)
    expected = torch.tensor([[0.25, 5.5], [-6.25, -1.0]])
    assert torch.allclose(linear({"sentence_embedding": v})["sentence_embedding"], expected)
    assert torch.allclose(adaptor({"sentence_embedding": v})["sentence_embedding"], v + 0.5 * expected)


def test_drift_penalty_by_hand():
    frozen = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
    adapted = torch.tensor([[0.0, 2.0], [0.0, 5.0]])  # row 1 turned 90 degrees (||.||^2 = 2), row 2 only scaled
    assert DriftLoss(0.5)(frozen, adapted)["drift"].item() == pytest.approx(0.5 * (2.0 + 0.0) / 2)
    assert DriftLoss(0.0)(frozen, adapted)["drift"].item() == 0.0
    head = SearchAdaptorHead(2, drift_weight=0.5)
    assert head.penalty(frozen, adapted)["drift"].item() == pytest.approx(0.5)


def test_query_only_head_leaves_documents_exactly_frozen_and_reloads(tiny_bert_dir, tmp_path):
    """`add_adapter(route="query")` on a one-tower model splits it into a Router whose routes share the
    backbone: documents stay the frozen model's embeddings bit for bit, queries change, and the adapter-only
    and the full folder both reload to the same embeddings (the full one with the backbone still shared)."""
    model = _load(tiny_bert_dir)
    frozen = {role: _enc(model, role) for role in ("query", "document")}
    head = model.add_adapter(LinearHeadConfig(route="query"), adapter_name="q")
    routes = model[0].sub_modules
    assert routes["query"][0] is routes["document"][0] and shared_backbone(model) is not None
    _perturb(head)
    queries = _enc(model, "query")
    assert np.abs(queries - frozen["query"]).max() > 1e-2
    np.testing.assert_array_equal(_enc(model, "document"), frozen["document"])
    np.testing.assert_array_equal(model.encode(TEXTS), frozen["document"])  # no task: the document route

    medadapt.save_adapter(model, tmp_path / "adapter")
    spec = json.loads((tmp_path / "adapter" / "medadapt_adapter.json").read_text())["adapters"]["q"]
    assert spec["location"] == "query" and spec["type"] == "linear"
    model.save(str(tmp_path / "full"))
    for folder in ("adapter", "full"):
        loaded = _load(tmp_path / folder)
        np.testing.assert_array_equal(_enc(loaded, "query"), queries)
        np.testing.assert_array_equal(_enc(loaded, "document"), frozen["document"])
        assert shared_backbone(loaded) is not None
    # the plain base takes the adapter too (its fingerprint is the one-tower model's)
    plain = _load(tiny_bert_dir)
    plain.load_adapter(str(tmp_path / "adapter"))
    np.testing.assert_array_equal(_enc(plain, "query"), queries)


def test_query_only_head_reads_the_frozen_models_cache(tiny_bert_dir, tmp_path):
    """The split model's document side is keyed as the plain model's (the same cache namespace), and so is
    its query side's backbone: nothing is re-encoded for a query-only head."""
    from medadapt.cache import EmbeddingCache

    cache = EmbeddingCache(tmp_path / "cache")
    plain = _load(tiny_bert_dir)
    split = _load(tiny_bert_dir)
    split.add_adapter(SearchAdaptorConfig(route="query"), adapter_name="q")
    for role in ("query", "document"):
        assert cache.namespace(split, role, "")[0] == cache.namespace(plain, role, "")[0]


@pytest.fixture()
def synonym_beir(tmp_path):
    """Queries name a condition by a lay word the documents never use (test_train_recipe's synonym set):
    the frozen random model has nothing to go on; a head must learn the words from the train queries."""
    from conftest import build_synonym_beir

    return build_synonym_beir(tmp_path / "syn")


def _sets(model_dir, data_dir, head):
    return [f"model.backbone={model_dir}", f"data.path={data_dir}",
            f"head={head}", "training.batch_size=4", "training.lr=3e-2", "training.epochs=30",
            "training.warmup_ratio=0", "eval.split=test", "eval.metrics=[ndcg@10, mrr@10]", "eval.expected={}"]


@pytest.mark.parametrize("head", ["{kind: linear, route: query}",
                                  "{kind: search_adaptor, route: all, drift_weight: 0.01}"])
def test_tiny_training_beats_the_frozen_model_and_the_folder_reloads(tiny_bert_dir, synonym_beir, tmp_path,
                                                                      monkeypatch, head):
    """The demo recipe on a tiny random BERT: the head beats the untrained model on held-out queries, the
    run folder reloads to the run's numbers, and a query-only head leaves documents exactly frozen."""
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.recipes import load_recipe, run_recipe

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    result = run_recipe(load_recipe(RECIPE, _sets(tiny_bert_dir, synonym_beir, head)), out, show_progress=False,
                        log=lambda _m: None)
    log = json.loads((out / "train_log.json").read_text())
    assert list(log["stage_steps"]) == ["main"] and "routing_stats" not in log
    losses = [r["loss"] for r in log["loss_history"]]
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
    if "drift" in head:
        assert all(r["drift"] >= 0 for r in log["loss_history"]) and log["loss_history"][-1]["drift"] > 0
    baseline = json.loads((out / "baseline_metrics.json").read_text())
    assert result.metrics["ndcg@10"] > baseline["ndcg@10"] + 0.05, (result.metrics, baseline)

    loaded, frozen = _load(out), _load(tiny_bert_dir)
    data = load_beir(synonym_beir, "test")
    again = evaluate_retrieval(loaded, data, "test", ["ndcg@10"], cache=EmbeddingCache(tmp_path / "other"),
                               show_progress=False)  # a fresh cache: encoded anew through the loaded folder
    assert again["ndcg@10"] == pytest.approx(result.metrics["ndcg@10"], abs=1e-6)
    docs = data.doc_texts()
    if "query" in head:
        np.testing.assert_array_equal(loaded.encode_document(docs), frozen.encode_document(docs))
        roles = sorted(json.loads(p.read_text())["role"] for p in (tmp_path / "cache").glob("*/meta.json"))
        assert roles == ["document", "query"]  # one namespace each: the frozen model's, never re-keyed
    else:
        assert np.abs(loaded.encode_document(docs) - frozen.encode_document(docs)).max() > 1e-3


def test_linear_heads_compose_with_moe_sections_and_bad_configs_are_one_clear_error(tiny_bert_dir, tmp_path):
    from medadapt.recipes import load_recipe

    sets = [f"model.backbone={tiny_bert_dir}", "data.path=medmini"]
    recipe = load_recipe(RECIPE, sets)
    assert recipe.head == LinearHeadConfig(route="query") and recipe.fast
    for bad, message in [
        ("training.shared_epochs=2", "training.shared_epochs=2: MoE-only options"),
        ("training.random_routing_epochs=1", "training.random_routing_epochs=1: MoE-only options"),
        ("loss.load_balance_weight=0.01", "loss.load_balance_weight=0.01: MoE-only options"),
    ]:
        with pytest.raises(ConfigError, match=message.replace(".", "[.]")):
            load_recipe(RECIPE, [*sets, bad])
    with pytest.raises(ConfigError, match="head.drift_weight=0.1: the backbone / LoRA path"):
        load_recipe(RECIPE, [*sets, "head={kind: search_adaptor, drift_weight: 0.1}", "model.freeze_backbone=false"])
    with pytest.raises(ValidationError):
        SearchAdaptorConfig(scale=0)
    with pytest.raises(ValidationError):
        LinearHeadConfig(rank=4)
    from medadapt.cli import app

    result = CliRunner().invoke(app, ["train", str(RECIPE), "--output", str(tmp_path / "o"), "-q",
                                      "--set", f"model.backbone={tiny_bert_dir}", "--set", "training.shared_epochs=2"])
    assert result.exit_code == 1 and "MoE-only options" in result.output
    assert len([ln for ln in result.output.splitlines() if ln.strip()]) == 1
    assert not (tmp_path / "o").exists()
    from medadapt.adapters.types import adapter_type

    with pytest.raises(ConfigError, match="is 16-d but the embedding is 32-d"):
        adapter_type("linear").from_dict({"dim": 16, "bias": False}, 32)


@pytest.mark.parametrize("route", ["all", "query"])
def test_drift_term_is_computed_on_the_whole_step_with_accumulation(route):
    """The drift part is taken on the gathered step's mapped rows: 4 chunks of 8 give the step of one batch
    of 32 (losses and weights), and a query-only head's drift reads the query rows alone."""
    from medadapt.moe import InfoNCESection, MoETrainingSection, train_head

    generator = torch.Generator().manual_seed(0)
    q, p = torch.randn(64, 8, generator=generator), torch.randn(64, 8, generator=generator)
    n = torch.randn(64, 2, 8, generator=generator)
    runs = []
    for batch, accumulation in ((32, 1), (8, 4)):
        head = SearchAdaptorHead(8, drift_weight=0.5)
        training = MoETrainingSection(epochs=2, batch_size=batch, gradient_accumulation_steps=accumulation,
                                      lr=1e-2, seed=0)
        runs.append((head, train_head(head, q, p, n, training, InfoNCESection(), route=route)))
    (big, res_big), (acc, res_acc) = runs
    assert [r["drift"] for r in res_big.loss_history][-1] > 0
    for a, b in zip(res_acc.loss_history, res_big.loss_history):
        for key in ("loss", "infonce", "drift"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (key, a, b)
    torch.testing.assert_close(acc.linear.weight, big.linear.weight, atol=1e-4, rtol=1e-3)
    # by hand: one step over all 64 items with a perturbed head logs the mean over the mapped rows only
    # (all: q, p and n; query: q; a mean over every row would be diluted by the untouched p and n rows)
    head = SearchAdaptorHead(8, drift_weight=0.5)
    _perturb(head)
    rows = torch.cat([q, p, n.reshape(-1, 8)]) if route == "all" else q
    with torch.no_grad():
        adapted = head({"sentence_embedding": rows.clone()})["sentence_embedding"]
        expected = 0.5 * (torch.nn.functional.normalize(adapted, dim=-1)
                          - torch.nn.functional.normalize(rows, dim=-1)).pow(2).sum(-1).mean()
    one = train_head(head, q, p, n, MoETrainingSection(epochs=1, batch_size=64, lr=1e-9), InfoNCESection(),
                     route=route)
    assert one.loss_history[0]["drift"] == pytest.approx(expected.item(), rel=1e-5)
