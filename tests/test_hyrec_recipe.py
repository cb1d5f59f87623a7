"""HyReC recipes: schema validation, `medadapt train recipes/hyrec-tiny.yaml` end to end through the CLI,
evaluation modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from medadapt.errors import ConfigError
from medadapt.hyrec.recipe import load_hyrec_recipe

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "hyrec-tiny.yaml"


@pytest.mark.parametrize("name", ["hyrec.yaml", "hyrec-tiny.yaml", "hyrec-minilm-zh.yaml",
                                  "hyrec-minilm-medquad.yaml"])
def test_shipped_recipes_validate(name):
    spec = load_hyrec_recipe(ROOT / "recipes" / name)
    assert spec.kind == "hyrec" and spec.loss.temperature == 0.05


def test_recipe_errors_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="bogus"):
        load_hyrec_recipe(TINY, ["model.bogus=1"])
    with pytest.raises(ConfigError, match="variant"):
        load_hyrec_recipe(TINY, ["model.variant=half"])
    other = tmp_path / "r.yaml"
    other.write_text("kind: care\nname: x\n")
    with pytest.raises(ConfigError, match="kind: hyrec"):
        load_hyrec_recipe(other)
    from medadapt.recipes.kinds import resolve_kind

    load, _ = resolve_kind(TINY)
    assert load is load_hyrec_recipe
    for bad in ("training.lexical_words=sometimes", "model.union_context=-1"):
        with pytest.raises(ConfigError):
            load_hyrec_recipe(TINY, [bad])


def test_words_in_training_need_the_union(tiny_bert_dir):
    from medadapt.hyrec.data import Example
    from medadapt.hyrec.model import HyReCConfig, HyReCModel
    from medadapt.hyrec.train import HyReCTrainConfig, train_hyrec
    from medadapt.losses.hyrec import HyReCLoss

    model = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCConfig(union=False, language="en"))
    examples = [Example("gout pain", "gout is a condition", []), Example("asthma", "asthma and wheezing", [])]
    with pytest.raises(ConfigError, match="semantic union"):
        train_hyrec(model, examples, HyReCTrainConfig(lexical_words="predicted"), HyReCLoss(union_weight=0))


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
    model = HyReCModel.load(out)
    again = evaluate_hyrec(model, tiny_beir_dir, "test", "hybrid", ["ndcg@10"], show_progress=False)
    assert again["ndcg@10"] == pytest.approx(metrics["hybrid/ndcg@10"], abs=1e-6)
    lex = evaluate_hyrec(out, tiny_beir_dir, "test", "lexical", ["ndcg@10"], show_progress=False)
    assert lex["ndcg@10"] == pytest.approx(metrics["lexical/ndcg@10"], abs=1e-6)
    mm = evaluate_hyrec(model, tiny_beir_dir, "test", "hybrid", ["ndcg@10"], fusion="minmax", show_progress=False)
    assert 0 <= mm["ndcg@10"] <= 1
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
    assert bad.exit_code == 1 and "HyReC model folder" in bad.output


def test_frozen_variant_with_state_cache_trains(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.hyrec.recipe import run_hyrec_recipe

    res = run_hyrec_recipe(TINY, tmp_path / "frozen", [
        f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "model.variant=frozen",
        "training.state_cache=memory", "training.dense_inputs=states", "training.train_dense_encoder=false",
        "eval.dense_source=states", "loss.union_weight=0", "training.epochs=2"],
        state_cache=SharedStateCache(None), show_progress=False, log=lambda m: None)
    assert res.loss_history and "union" not in res.loss_history[0]
    assert set(res.mode_metrics) == {"lexical", "dense", "hybrid"}
    # projectors only: lexicon encoder frozen and cached, a learned per-term bias; frozen parts stay unchanged
    from medadapt.hyrec import HyReCModel

    before = HyReCModel.from_backbone(str(tiny_bert_dir), HyReCModel.load(tmp_path / "frozen").config)
    res2 = run_hyrec_recipe(TINY, tmp_path / "heads", [
        f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "model.variant=frozen",
        "model.term_bias=true", "training.state_cache=memory", "training.dense_inputs=states",
        "training.train_dense_encoder=false", "training.train_lexicon_encoder=false", "eval.dense_source=states",
        "training.epochs=10", "training.batch_size=6", "training.lr=1e-2"],
        state_cache=SharedStateCache(None), show_progress=False, log=lambda m: None)
    assert res2.loss_history[-1]["loss"] < res2.loss_history[0]["loss"]
    after = HyReCModel.load(tmp_path / "heads")
    for a, b in zip(after.lexicon.parameters(), before.lexicon.parameters()):
        assert torch.equal(a, b)
    assert not torch.equal(after.weight_proj.term_bias.weight, torch.zeros_like(after.weight_proj.term_bias.weight))
    with pytest.raises(ConfigError, match="frozen"):
        run_hyrec_recipe(TINY, tmp_path / "bad", [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}",
                                                  "training.state_cache=memory"], show_progress=False)


@pytest.mark.parametrize("words", ["labels", "predicted"])
def test_words_in_training_lexical_score_and_context_union_head(tiny_bert_dir, tiny_beir_dir, tmp_path, words):
    """Projectors-only training with words in the lexical score (eq. 10) and the windowed union head: the
    loss and its union part go down, and the saved model keeps the head's shape."""
    from medadapt.hyrec import HyReCModel
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.hyrec.recipe import run_hyrec_recipe

    res = run_hyrec_recipe(TINY, tmp_path / words, [
        f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", "model.variant=frozen",
        "model.union_context=1", f"training.lexical_words={words}", "training.state_cache=memory",
        "training.dense_inputs=states", "training.train_dense_encoder=false",
        "training.train_lexicon_encoder=false", "eval.dense_source=states", "eval.modes=[lexical]",
        "training.epochs=10", "training.batch_size=6", "training.lr=1e-2"],
        state_cache=SharedStateCache(None), show_progress=False, log=lambda m: None)
    first, last = res.loss_history[0], res.loss_history[-1]
    assert last["loss"] < first["loss"] and last["union"] < first["union"]
    assert 0 <= res.mode_metrics["lexical"]["ndcg@10"] <= 1
    model = HyReCModel.load(tmp_path / words)
    assert model.config.union_context == 1 and model.union_proj.context == 1
