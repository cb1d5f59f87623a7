"""`medadapt train` on the tiny CPU recipe: trains, lowers the loss, beats the frozen backbone on held-out
queries, saves a model that reloads to identical embeddings, and reports bad recipes cleanly."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import medadapt
from medadapt.cli import app
from medadapt.recipes import load_recipe

TINY = Path(__file__).resolve().parents[1] / "recipes" / "med-moe-embed-tiny.yaml"


@pytest.fixture()
def synonym_beir_dir(tmp_path):
    """Documents name a condition; queries use a different word of the same topic, never the name. The
    frozen random model has no lexical overlap to go on; a head learns the word -> condition association
    from the train queries and must carry it over to differently phrased held-out test queries."""
    from conftest import TOPICS, write_beir

    corpus, queries, train, test = {}, {}, {}, {}
    for i, (name, words) in enumerate(TOPICS):
        lay = words.split()[2]
        corpus[f"d{i}"] = ("", f"{name} is a condition")
        queries[f"t{i}"], train[f"t{i}"] = f"treatment of {lay}", {f"d{i}": 1}
        queries[f"q{i}"], test[f"q{i}"] = f"symptoms of {lay}", {f"d{i}": 1}
    return write_beir(tmp_path / "syn", corpus, queries, {"train": train, "test": test})


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
    metrics = json.loads((out / "metrics.json").read_text())

    data = load_beir(synonym_beir_dir, "test")
    frozen = evaluate_retrieval(medadapt.load(str(tiny_bert_dir)), data, "test", ["ndcg@10"],
                                cache=EmbeddingCache(cache_env), show_progress=False)
    assert metrics["ndcg@10"] > frozen["ndcg@10"] + 0.05, (metrics, frozen)

    # the saved folder reloads (medadapt.load and plain trust_remote_code) to identical embeddings
    from sentence_transformers import SentenceTransformer

    texts = ["symptoms of gout", "asthma inhaler wheezing"]
    a = medadapt.load(str(out), device="cpu")
    b = SentenceTransformer(str(out), trust_remote_code=True, device="cpu")
    np.testing.assert_array_equal(a.encode_query(texts), b.encode_query(texts))
    assert (out / "recipe.yaml").is_file() and (out / "checkpoints").is_dir()
    # and evaluates through the CLI to the same numbers as the run reported
    ev = CliRunner().invoke(app, ["eval", "--model", str(out), "--data", str(synonym_beir_dir), "--output",
                                  str(tmp_path / "ev.json"), "--metrics", "ndcg@10,mrr@10", "-q"])
    assert ev.exit_code == 0, ev.output
    again = json.loads((tmp_path / "ev.json").read_text())
    assert again["ndcg@10"] == pytest.approx(metrics["ndcg@10"], abs=1e-4)


def test_bad_recipe_is_one_line_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(TINY.read_text().replace("top_k: 2", "top_k: 9"))
    result = CliRunner().invoke(app, ["train", str(bad), "--output", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "head.moe: Value error, top_k must be in [1, 4]" in result.output
    assert not (tmp_path / "o").exists()


def test_frozen_backbone_without_head_is_refused(tiny_bert_dir, tiny_beir_dir, tmp_path, cache_env):
    from medadapt.errors import ConfigError
    from medadapt.training import run_recipe

    recipe = load_recipe(TINY, [*overrides(tiny_bert_dir, tiny_beir_dir), "head={kind: none}"])
    with pytest.raises(ConfigError, match="nothing to train"):
        run_recipe(recipe, tmp_path / "o", show_progress=False)


@pytest.mark.slow
def test_slow_path_lora_with_head_trains_and_reloads(tiny_bert_dir, synonym_beir_dir, tmp_path, cache_env):
    """`model.peft` switches the same recipe to end-to-end training through sentence-transformers' trainer:
    LoRA adapters on the backbone plus the head, saved and reloaded as one model."""
    from medadapt.training import run_recipe

    recipe = load_recipe(TINY, [
        *overrides(tiny_bert_dir, synonym_beir_dir),
        "model.peft={kind: lora, r: 4, alpha: 8, target_modules: [query, value]}",
        "training.epochs=2", "training.batch_size=4", "training.lr=1e-3",
    ])
    out = tmp_path / "lora"
    result = run_recipe(recipe, out, show_progress=False)
    assert result.loss_history and result.metrics["ndcg@10"] > 0
    model = medadapt.load(str(out), device="cpu")
    names = [type(m).__name__ for m in model]
    assert "MoEHead" in names
    assert any("lora" in n for n, _ in model.named_parameters())
    texts = ["symptoms of thirst"]
    np.testing.assert_allclose(model.encode_query(texts), medadapt.load(str(out)).encode_query(texts), atol=1e-6)
