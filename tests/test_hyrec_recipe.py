"""HyReC recipes: schema validation, `medadapt train recipes/hyrec-tiny.yaml` end to end through the CLI
(trained beats untrained on held-out queries), evaluation modes, the frozen variant's fast paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from medadapt.errors import ConfigError
from medadapt.hyrec.sections import HyReCRecipe
from medadapt.recipes import load_recipe, run_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "hyrec-tiny.yaml"


def load_hyrec_recipe(path, overrides=None) -> HyReCRecipe:
    return load_recipe(path, overrides, expect=HyReCRecipe)


@pytest.mark.parametrize("name", ["hyrec.yaml", "hyrec-tiny.yaml", "hyrec-minilm-zh.yaml",
                                  "hyrec-minilm-medquad.yaml"])
def test_shipped_recipes_validate(name):
    spec = load_hyrec_recipe(ROOT / "recipes" / name)
    assert isinstance(spec, HyReCRecipe) and spec.kind == "hyrec" and spec.loss.temperature == 0.05


def test_recipe_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="bogus"):
        load_hyrec_recipe(TINY, ["model.bogus=1"])
    with pytest.raises(ConfigError, match="variant"):
        load_hyrec_recipe(TINY, ["model.variant=half"])
    other = tmp_path / "r.yaml"
    other.write_text("kind: nonsense\nname: x\n")
    with pytest.raises(ConfigError, match="unknown recipe kind 'nonsense'.*hyrec"):
        load_hyrec_recipe(other)
    from medadapt.recipes.registry import get_kind

    assert get_kind("hyrec").schema is HyReCRecipe
    for bad in ("training.lexical_words=sometimes", "model.union_context=-1", "training.log_every=5",
                "model.device=cpu"):
        with pytest.raises(ConfigError):
            load_hyrec_recipe(TINY, [bad])
    with pytest.raises(ConfigError, match="in-batch negatives"):
        load_hyrec_recipe(TINY, ["training.batch_size=1"])
    with pytest.raises(ConfigError, match="at least one of"):
        load_hyrec_recipe(TINY, ["loss.lexical_weight=0", "loss.dense_weight=0", "loss.union_weight=0"])
    with pytest.raises(ConfigError, match="train_lexicon_encoder: false needs"):
        load_hyrec_recipe(TINY, ["model.variant=frozen", "training.train_lexicon_encoder=false"])


def test_words_in_training_are_ignored_without_the_union(tiny_bert_dir):
    """A model without the semantic union scores tokens only (as the recipe does with loss.union_weight 0),
    whatever lexical_words says: the same losses as lexical_words: none."""
    from medadapt.hyrec.data import Example
    from medadapt.hyrec.model import HyReCConfig, HyReCModel
    from medadapt.hyrec.sections import HyReCLossSection, HyReCTrainingSection
    from medadapt.hyrec.train import train_hyrec

    examples = [Example("gout pain", "gout is a condition", []), Example("asthma", "asthma and wheezing", [])]
    losses = {}
    for words in ("predicted", "none"):
        torch.manual_seed(0)
        model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(union=False, language="en"))
        res = train_hyrec(model, examples, HyReCTrainingSection(lexical_words=words, epochs=2),
                          HyReCLossSection(union_weight=0))
        losses[words] = [r["loss"] for r in res.loss_history]
        assert "union" not in res.loss_history[0]
    assert losses["predicted"] == losses["none"] and len(losses["none"]) == 2


def test_cli_trains_tiny_recipe_end_to_end(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.cli import app
    from medadapt.hyrec import HyReCModel, evaluate_hyrec

    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", str(TINY), "--output", str(out), "--quiet",
        "--set", f"model.backbone={tiny_bert_dir}", "--set", f"data.path={tiny_beir_dir}",
        "--set", "training.epochs=4", "--set", "training.batch_size=6", "--set", "training.lr=1e-3",
    ])
    assert result.exit_code == 0, result.output
    log = json.loads((out / "train_log.json").read_text())
    losses = [r["loss"] for r in log["loss_history"]]
    assert len(losses) == 8
    assert sum(losses[-2:]) < sum(losses[:2])  # the loss goes down
    assert {"lexical", "dense", "union"} <= set(log["loss_history"][0])
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"lexical/ndcg@10", "dense/ndcg@10", "hybrid/ndcg@10", "lexical/q_terms"} <= set(metrics)
    assert (tmp_path / "run.checkpoints").is_dir() and not (out / "checkpoints").exists()
    model = HyReCModel.load(out)
    # held-out test queries ("symptoms of X"; training queries are "treatment X ..."): the trained model
    # beats the untrained one (same backbone, config and seed). Lexical matching of the disease name is
    # already at this set's ceiling before training (0.948: the graded second document of q0 shares no
    # word), so the gain shows on the dense side (measured 0.649 -> 0.704); lexical and hybrid must not lose.
    torch.manual_seed(42)  # the recipe's seed, as the runner seeds before building the model
    untrained = HyReCModel.from_backbone(str(tiny_bert_dir), model.config, seed=42)
    before = {mode: evaluate_hyrec(untrained, tiny_beir_dir, "test", mode, ["ndcg@10"], show_progress=False)
              for mode in ("lexical", "dense", "hybrid")}
    assert metrics["dense/ndcg@10"] > before["dense"]["ndcg@10"] + 0.03, (before, metrics)
    for mode in ("lexical", "hybrid"):
        assert metrics[f"{mode}/ndcg@10"] >= before[mode]["ndcg@10"] - 1e-6, (mode, before, metrics)
    assert metrics["lexical/q_terms"] < before["lexical"]["q_terms"]  # and it learned sparser queries
    again = evaluate_hyrec(model, tiny_beir_dir, "test", "hybrid", ["ndcg@10"], show_progress=False)
    assert again["ndcg@10"] == pytest.approx(metrics["hybrid/ndcg@10"], abs=1e-6)
    lex = evaluate_hyrec(out, tiny_beir_dir, "test", "lexical", ["ndcg@10"], show_progress=False)
    assert lex["ndcg@10"] == pytest.approx(metrics["lexical/ndcg@10"], abs=1e-6)
    mm, runs = evaluate_hyrec(model, tiny_beir_dir, "test", "hybrid", ["ndcg@10"], fusion="minmax",
                              show_progress=False, return_runs=True)
    from medadapt.data import load_beir
    from medadapt.eval.metrics import evaluate_run
    from medadapt.retrieval.fusion import minmax_normalize

    by_hand = {}  # min-max normalise each list, sum, missing documents count 0
    for q in runs["lexical"]:
        lex, den = minmax_normalize(runs["lexical"][q]), minmax_normalize(runs["dense"][q])
        by_hand[q] = {d: lex.get(d, 0.0) + den.get(d, 0.0) for d in set(lex) | set(den)}
    qrels = load_beir(tiny_beir_dir, ["test"]).qrels["test"]
    assert mm["ndcg@10"] == pytest.approx(evaluate_run(qrels, by_hand, ["ndcg@10"])["ndcg@10"], abs=1e-9)
    with pytest.raises(ConfigError, match="mode"):
        evaluate_hyrec(model, tiny_beir_dir, "test", "sparse")

    # `medadapt eval --mode` on the saved folder gives the recipe's numbers for each side
    runner = CliRunner()
    for mode in ("lexical", "dense", "hybrid"):
        res = runner.invoke(app, ["eval", "--model", str(out), "--data", str(tiny_beir_dir), "--split", "test",
                                  "--mode", mode, "--metrics", "ndcg@10", "--no-cache", "--quiet",
                                  "--output", str(tmp_path / f"{mode}.json")])
        assert res.exit_code == 0, res.output
        got = json.loads((tmp_path / f"{mode}.json").read_text())
        assert got["ndcg@10"] == pytest.approx(metrics[f"{mode}/ndcg@10"], abs=1e-6)
    bad = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir),
                              "--mode", "lexical", "--quiet"])
    assert bad.exit_code == 1 and "a learned-lexical module" in bad.output


def _run(tiny_bert_dir, tiny_beir_dir, out, overrides):
    """``medadapt train`` of the tiny recipe on the tiny BERT / BEIR fixtures, in this process."""
    recipe = load_hyrec_recipe(TINY, [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", *overrides])
    return run_recipe(recipe, out, show_progress=False, log=lambda m: None)


def test_frozen_variant_with_state_cache_trains(tiny_bert_dir, tiny_beir_dir, tmp_path):
    res = _run(tiny_bert_dir, tiny_beir_dir, tmp_path / "frozen", [
        "model.variant=frozen", "training.state_cache=memory", "training.dense_inputs=states",
        "training.train_dense_encoder=false", "eval.dense_source=states", "loss.union_weight=0", "training.epochs=2"])
    assert res.loss_history and "union" not in res.loss_history[0]
    assert set(res.details["mode_metrics"]) == {"lexical", "dense", "hybrid"}
    assert res.metrics["lexical/ndcg@10"] == res.details["mode_metrics"]["lexical"]["ndcg@10"]
    assert res.details["train_examples"] == 12 and res.details["steps"] == 4
    # projectors only: lexicon encoder frozen and cached, a learned per-term bias; frozen parts stay unchanged
    from medadapt.hyrec import HyReCModel

    before = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCModel.load(tmp_path / "frozen").config)
    res2 = _run(tiny_bert_dir, tiny_beir_dir, tmp_path / "heads", [
        "model.variant=frozen", "model.term_bias=true", "training.state_cache=memory", "training.dense_inputs=states",
        "training.train_dense_encoder=false", "training.train_lexicon_encoder=false", "eval.dense_source=states",
        "training.epochs=10", "training.batch_size=6", "training.lr=1e-2"])
    assert res2.loss_history[-1]["loss"] < res2.loss_history[0]["loss"]
    after = HyReCModel.load(tmp_path / "heads")
    for a, b in zip(after.lexicon.parameters(), before.lexicon.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(after.dense_layers, before.dense_layers):
        for pa, pb in zip(a.parameters(), b.parameters()):
            assert torch.equal(pa, pb)
    assert not torch.equal(after.weight_proj.term_bias.weight, torch.zeros_like(after.weight_proj.term_bias.weight))
    with pytest.raises(ConfigError, match="frozen"):
        _run(tiny_bert_dir, tiny_beir_dir, tmp_path / "bad", ["training.state_cache=memory"])


@pytest.mark.parametrize("words", ["labels", "predicted"])
def test_words_in_training_lexical_score_and_context_union_head(tiny_bert_dir, tiny_beir_dir, tmp_path, words):
    """Projectors-only training with words in the lexical score (eq. 10) and the windowed union head: the
    loss and its union part go down, and the saved model keeps the head's shape."""
    from medadapt.hyrec import HyReCModel

    res = _run(tiny_bert_dir, tiny_beir_dir, tmp_path / words, [
        "model.variant=frozen", "model.union_context=1", f"training.lexical_words={words}",
        "training.state_cache=memory", "training.dense_inputs=states", "training.train_dense_encoder=false",
        "training.train_lexicon_encoder=false", "eval.dense_source=states", "eval.modes=[lexical]",
        "training.epochs=10", "training.batch_size=6", "training.lr=1e-2"])
    first, last = res.loss_history[0], res.loss_history[-1]
    assert last["loss"] < first["loss"] and last["union"] < first["union"]
    assert set(res.metrics) == {"lexical/ndcg@10", "lexical/recall@10", "lexical/q_terms", "lexical/d_terms"}
    model = HyReCModel.load(tmp_path / words)
    assert model.config.union_context == 1 and model.union_proj.context == 1


def test_a_named_dense_miner_is_loaded_on_the_runs_device(monkeypatch, tiny_bert_dir, tiny_beir_dir):
    """With one process too, the dense miner goes to ``ctx.device`` (the process's GPU). Left to
    ``build_examples``, a named miner was loaded on the CPU: on an H100 machine HyReC spent 257 s encoding
    1,024 documents before its first step. ``build_examples`` itself loads a named miner on ``device``."""
    from types import SimpleNamespace

    import medadapt.models as models
    from medadapt.data import load_beir
    from medadapt.hyrec.data import build_examples, share_miner_encoding

    real, calls = models.load, []

    def recording_load(name, device=None, **kwargs):
        calls.append((str(name), device))
        return real(name, device="cpu", **kwargs)  # this machine has no GPU: the device asked for is recorded

    monkeypatch.setattr(models, "load", recording_load)
    ctx = SimpleNamespace(device="cuda:3", accelerator=SimpleNamespace(num_processes=1),
                          share_encoding=lambda *a: pytest.fail("one process has no share to encode"))
    data = load_beir(tiny_beir_dir, ["train"])
    miner = share_miner_encoding(ctx, data, "dense", 2, str(tiny_bert_dir))
    assert calls == [(str(tiny_bert_dir), "cuda:3")] and not isinstance(miner, str)
    for negatives, num in (("bm25", 2), ("dense", 0)):  # no dense mining: nothing loaded
        assert share_miner_encoding(ctx, data, negatives, num, "name") == "name"
    calls.clear()
    examples = build_examples(data, "train", miner_model=str(tiny_bert_dir), window=(1, 3), num_negatives=1,
                              device="cuda:1", show_progress=False)
    assert calls == [(str(tiny_bert_dir), "cuda:1")] and examples and all(e.negatives for e in examples)


def test_evaluating_a_saved_hyrec_folder_refuses_a_missing_device_before_loading(tmp_path):
    from medadapt.errors import ModelLoadError
    from medadapt.hyrec.evaluate import evaluate_hyrec

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="CUDA"):
        evaluate_hyrec(tmp_path / "not-read", tmp_path / "not-read-either", device="cuda")
