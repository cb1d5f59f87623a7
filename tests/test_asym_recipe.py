"""CARE recipes: schema validation and the tiny CPU twin (recipes/care-tiny.yaml) end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_asym import build_tiny_qwen2

pytestmark = pytest.mark.filterwarnings("ignore")

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


@pytest.mark.parametrize("name", ["care.yaml", "care-tiny.yaml", "care-minilm.yaml", "care-minilm-static.yaml"])
def test_shipped_care_recipes_validate(name):
    from medadapt.asym.recipe import is_care_recipe, load_care_recipe

    assert is_care_recipe(RECIPES / name)
    recipe = load_care_recipe(RECIPES / name)
    assert recipe.kind == "care" and recipe.name


def test_schema_errors_are_clear():
    from medadapt.asym.recipe import is_care_recipe, load_care_recipe
    from medadapt.errors import ConfigError

    with pytest.raises(ConfigError, match="stage1.learning_rate"):
        load_care_recipe(RECIPES / "care-tiny.yaml", ["stage1.learning_rate=1"])
    with pytest.raises(ConfigError, match="'sentence_transformer', 'pruned', 'static'"):
        load_care_recipe(RECIPES / "care-tiny.yaml", ["query.kind=distilled"])
    with pytest.raises(ConfigError, match="not a CARE recipe"):
        load_care_recipe({"name": "x"})
    assert not is_care_recipe(RECIPES / "med-moe-embed-tiny.yaml")


def test_tiny_recipe_runs_every_phase(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.asym import has_lora, route_modules
    from medadapt.asym.recipe import run_care_recipe
    from medadapt.cache import EmbeddingCache

    qwen = build_tiny_qwen2(tmp_path / "q")
    out = tmp_path / "run"
    overrides = [f"document.model={qwen}", f"query.model={tiny_bert_dir}", f"data.path={tiny_beir_dir}"]
    result = run_care_recipe(RECIPES / "care-tiny.yaml", out, overrides, cache=EmbeddingCache(tmp_path / "cache"),
                             show_progress=False, log=lambda m: None)
    assert set(result.stages) == {"init_document", "init_query", "stage1", "stage2"}
    assert 0.0 <= result.metrics["ndcg@10"] <= 1.0
    assert json.loads((out / "metrics.json").read_text())["ndcg@10"] == pytest.approx(result.metrics["ndcg@10"], abs=1e-6)
    assert (out / "checkpoints" / "stage2").is_dir()
    model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    assert not has_lora(route_modules(model, "document")[0])  # merged on save
    assert model.encode_query(["gout"]).shape == model.encode_document(["gout"]).shape == (1, 32)
    # a second run resumes every phase from its final checkpoint and reproduces the model
    again = run_care_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides,
                            cache=EmbeddingCache(tmp_path / "cache"), show_progress=False, log=lambda m: None)
    assert again.metrics == pytest.approx(result.metrics)


@pytest.mark.parametrize("query", ["{kind: pruned, layers: 1}", "{kind: static}"])
def test_tiny_recipe_with_pruned_or_static_query_tower_and_frozen_documents(query, tiny_beir_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.asym.recipe import run_care_recipe
    from medadapt.cache import EmbeddingCache

    qwen = build_tiny_qwen2(tmp_path / "q")
    overrides = [f"document.model={qwen}", f"data.path={tiny_beir_dir}", f"query={query}", "init.query=null",
                 "init.document=null", "stage2.train_document=false", "architecture.truncate_to=null"]
    result = run_care_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides,
                             cache=EmbeddingCache(tmp_path / "cache"), show_progress=False, log=lambda m: None)
    assert set(result.stages) == {"stage1", "stage2"} and 0.0 <= result.metrics["ndcg@10"] <= 1.0
    model = SentenceTransformer(str(tmp_path / "run"), device="cpu", trust_remote_code=True)
    assert model.encode_query(["gout"]).shape == model.encode_document(["gout"]).shape == (1, 48)
