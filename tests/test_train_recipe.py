"""`medadapt train` on the tiny `kind: moe` recipe: trains, lowers the loss, beats the frozen backbone on
held-out queries, saves a folder that loads to the trained model's encodings, resumes only its own
checkpoints (beside the folder), and reports bad recipes cleanly."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import medadapt
from medadapt.cli import app
from medadapt.errors import ConfigError
from medadapt.recipes import load_recipe, run_recipe

TINY = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml"


@pytest.fixture()
def synonym_beir_dir(tmp_path):
    """Documents name a condition; queries use a different word of the same topic, never the name. The
    frozen random model has no lexical overlap to go on; a head learns the word -> condition association
    from the train queries and must carry it over to differently phrased held-out test queries."""
    from conftest import build_synonym_beir

    return build_synonym_beir(tmp_path / "syn")


@pytest.fixture()
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def overrides(model_dir, data_dir):
    return [
        f"model.backbone={model_dir}",
        f"data.path={data_dir}",
        "data.hard_negatives.window=[2, 6]",
        "head.expansion=1",
        "head.residual_scale=1.0",
        "training.batch_size=4",
        "training.lr=1e-2",
        "training.shared_epochs=5",
        "training.random_routing_epochs=2",
        "training.epochs=30",
        "eval.split=test",
        "eval.metrics=[ndcg@10, mrr@10]",
    ]


def test_train_cli_end_to_end(tiny_bert_dir, synonym_beir_dir, tmp_path, cache_env):
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval

    out = tmp_path / "run"
    args = ["train", str(TINY), "--output", str(out), "-q"]
    for o in overrides(tiny_bert_dir, synonym_beir_dir):
        args += ["--set", o]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    log = json.loads((out / "train_log.json").read_text())
    losses = [r["loss"] for r in log["loss_history"]]
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3])
    assert log["stage_steps"] == {"shared": 15, "random": 6, "learned": 90}  # 12 pairs, batch 4
    assert sum(log["routing_stats"]["running_counts"]) == 2 * 30 * 12 * 4  # top-2 x 30 epochs x 12 x 4 rows
    metrics = json.loads((out / "metrics.json").read_text())

    data = load_beir(synonym_beir_dir, "test")
    frozen = evaluate_retrieval(medadapt.load(str(tiny_bert_dir)), data, "test", ["ndcg@10"],
                                cache=EmbeddingCache(cache_env), show_progress=False)
    assert metrics["ndcg@10"] > frozen["ndcg@10"] + 0.05, (metrics, frozen)
    assert (out / "recipe.yaml").is_file() and (tmp_path / "run.checkpoints").is_dir()
    assert not (out / "checkpoints").exists()  # checkpoints live beside the model folder
    assert load_recipe(out / "recipe.yaml").training_identity() == load_recipe(
        TINY, overrides(tiny_bert_dir, synonym_beir_dir)).training_identity()
    # the folder evaluates through the CLI to the same numbers as the run reported
    ev = CliRunner().invoke(app, ["eval", "--model", str(out), "--data", str(synonym_beir_dir), "--output",
                                  str(tmp_path / "ev.json"), "--metrics", "ndcg@10,mrr@10", "-q"])
    assert ev.exit_code == 0, ev.output
    again = json.loads((tmp_path / "ev.json").read_text())
    assert again["ndcg@10"] == pytest.approx(metrics["ndcg@10"], abs=1e-4)


def test_saved_folder_loads_to_the_trained_model(tiny_bert_dir, synonym_beir_dir, tmp_path, cache_env,
                                                  monkeypatch):
    """train -> save -> load: the loaded folder encodes exactly as the model `train` returned in memory
    (head weights, residual scale and routing included)."""
    from medadapt.recipes import registry

    kind = registry.get_kind("moe")
    trained = []

    def keep(recipe, ctx):
        trained.append(kind.train(recipe, ctx))
        return trained[-1]

    monkeypatch.setitem(registry.systems._SYSTEMS, "moe", dataclasses.replace(kind, train=keep))
    recipe = load_recipe(TINY, [*overrides(tiny_bert_dir, synonym_beir_dir), "training.epochs=3",
                                "head.residual_scale=0.5"])
    out = tmp_path / "run"
    run_recipe(recipe, out, show_progress=False, evaluate=False, log=lambda m: None)
    (model,) = trained
    texts = ["symptoms of thirst", "treatment of wheezing", "gout"]
    loaded = medadapt.load(str(out), device="cpu")
    from medadapt.adapters import find_head
    from medadapt.moe import MoEHead

    head = find_head(model, MoEHead)
    assert head.residual_scale == 0.5 and head.routing == "learned"
    assert find_head(loaded, MoEHead).residual_scale == 0.5
    for method in ("encode_query", "encode_document"):
        np.testing.assert_allclose(getattr(loaded, method)(texts), getattr(model, method)(texts),
                                   atol=1e-6, rtol=0)
    frozen = medadapt.load(str(tiny_bert_dir), device="cpu").encode_query(texts)
    assert np.abs(loaded.encode_query(texts) - frozen).max() > 1e-3  # the head changed the embeddings


def test_rerun_resumes_its_own_checkpoints_and_refuses_another_recipes(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                       cache_env):
    from medadapt.training import TrainingError

    base = [*overrides(tiny_bert_dir, tiny_beir_dir), "training.epochs=2",
            "training.checkpoint_every_steps=4"]
    out = tmp_path / "run"
    first = run_recipe(load_recipe(TINY, base), out, show_progress=False, evaluate=False, log=lambda m: None)
    again = run_recipe(load_recipe(TINY, base), out, show_progress=False, evaluate=False, log=lambda m: None)
    assert again.loss_history == first.loss_history and again.train_seconds < first.train_seconds  # resumed
    other = load_recipe(TINY, [*base, "training.lr=5e-3"])
    with pytest.raises(TrainingError, match="another run"):
        run_recipe(other, out, show_progress=False, evaluate=False, log=lambda m: None)
    fresh = run_recipe(other, out, show_progress=False, evaluate=False, overwrite=True, log=lambda m: None)
    assert fresh.loss_history[0]["loss"] == first.loss_history[0]["loss"]  # same start, other lr
    assert fresh.loss_history[-1]["loss"] != first.loss_history[-1]["loss"]


def test_bad_recipe_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("top_k: 2", "top_k: 9"))
    result = CliRunner().invoke(app, ["train", str(bad), "--output", str(tmp_path / "o")])
    assert result.exit_code == 1
    line = TINY.read_text().splitlines().index("head:") + 1  # the head section, whose validator refuses it
    assert f"bad.yaml:{line}: invalid recipe: head: top_k must be in [1, 4]" in result.output
    assert not (tmp_path / "o").exists()


def test_frozen_backbone_without_head_is_refused(tiny_bert_dir, tiny_beir_dir):
    with pytest.raises(ConfigError, match="nothing to train"):
        load_recipe(TINY, [*overrides(tiny_bert_dir, tiny_beir_dir), "head={kind: none}"])


@pytest.mark.parametrize("setting, field", [
    ("training.shared_epochs=1", "training.shared_epochs=1"),
    ("training.random_routing_epochs=2", "training.random_routing_epochs=2"),
    ("loss.load_balance_weight=0.01", "loss.load_balance_weight=0.01"),
])
def test_slow_path_refuses_what_it_cannot_train(tiny_bert_dir, tiny_beir_dir, setting, field):
    """The backbone / LoRA path has no stage schedule and no load-balancing term: a recipe asking for them
    is refused by name instead of silently training something else."""
    slow = [*overrides(tiny_bert_dir, tiny_beir_dir), "model.freeze_backbone=false",
            "training.shared_epochs=0", "training.random_routing_epochs=0", "loss.load_balance_weight=0"]
    assert not load_recipe(TINY, slow).fast  # valid without them
    with pytest.raises(ConfigError, match=f"{field.replace('.', '[.]')}: the backbone / LoRA path"):
        load_recipe(TINY, [*slow, setting])
    # without routed experts there is no load-balancing term to ignore
    plain = load_recipe(TINY, [*slow, "head.routed_experts=[]", "head.top_k=0",
                               "loss.load_balance_weight=0.01"])
    assert plain.loss.load_balance_weight == 0.01
