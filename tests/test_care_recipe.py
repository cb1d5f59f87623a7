"""CARE recipes (``kind: care``): schema validation, the Python API equal to the YAML, and the tiny CPU twin
(recipes/care-tiny.yaml) end to end through the one runner (``medadapt.recipes.run_recipe``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


pytestmark = pytest.mark.filterwarnings("ignore")

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
QUIET = {"show_progress": False, "log": lambda m: None}


@pytest.mark.parametrize("name", ["care.yaml", "care-tiny.yaml", "care-minilm.yaml", "care-minilm-1layer.yaml",
                                  "care-minilm-1layer-general.yaml", "care-minilm-static.yaml"])
def test_shipped_care_recipes_validate(name):
    from medadapt.care.sections import CareRecipe
    from medadapt.recipes import load_recipe

    recipe = load_recipe(RECIPES / name, expect=CareRecipe)
    assert type(recipe) is CareRecipe
    assert recipe.name == ("care-qwen3-4b" if name == "care.yaml" else name.removesuffix(".yaml"))
    if name == "care.yaml":  # the paper setting (Table 17, Appendix C.3)
        assert recipe.document.lora.r == 32 and recipe.document.lora.alpha == 64
        assert (recipe.init.query.batch_size, recipe.stage1.batch_size, recipe.stage2.batch_size) == (640, 2560, 640)
        assert {recipe.init.document.lr, recipe.stage1.lr, recipe.stage2.lr} == {1e-4}
        assert {recipe.init.query.warmup_ratio, recipe.stage1.warmup_ratio, recipe.stage2.warmup_ratio} == {0.05}
        assert recipe.document.mrl_dims == [768, 1024, 1536, 2048, 2560]
    if name.startswith("care-minilm"):  # the CPU shortcut: frozen document tower, no independent init
        assert not recipe.stage2.train_document and recipe.init.query is None and recipe.init.document is None
    if name == "care-minilm-1layer-general.yaml":  # the LOSO settings, with no test question in stage I
        s1 = recipe.stage1
        assert s1.query_splits == ["train", "dev"] and recipe.eval.split not in s1.query_splits
        assert s1.include_corpus and s1.max_corpus_texts is None and s1.max_texts is None
        assert (s1.epochs, s1.distill_weight, recipe.stage2.align_weight) == (4, 1.0, 1.0)


def test_schema_errors_are_clear():
    from medadapt.care.sections import CareRecipe
    from medadapt.errors import ConfigError
    from medadapt.recipes import load_recipe

    with pytest.raises(ConfigError, match="stage1.learning_rate"):
        load_recipe(RECIPES / "care-tiny.yaml", ["stage1.learning_rate=1"])
    with pytest.raises(ConfigError, match="'sentence_transformer', 'pruned', 'static'"):
        load_recipe(RECIPES / "care-tiny.yaml", ["query.kind=distilled"])
    with pytest.raises(ConfigError, match="stage1: .*cannot all be 0"):
        load_recipe(RECIPES / "care-tiny.yaml", ["stage1.contrastive_weight=0", "stage1.mse_weight=0"])
    distil_only = ["stage1.contrastive_weight=0", "stage1.mse_weight=0", "stage1.distill_weight=1"]
    assert load_recipe(RECIPES / "care-tiny.yaml", distil_only).stage1.distill_weight == 1
    assert load_recipe(RECIPES / "care-tiny.yaml").stage1.distill_weight == 0  # the paper's eq. 3 by default
    with pytest.raises(ConfigError, match="stage1.corpus_units: Input should be 'documents' or 'sentences'"):
        load_recipe(RECIPES / "care-tiny.yaml", ["stage1.corpus_units=pages"])
    with pytest.raises(ConfigError, match="no 'kind:'"):
        load_recipe({"name": "x"})
    with pytest.raises(ConfigError, match="not a CareRecipe"):
        load_recipe(RECIPES / "bmretriever-tiny.yaml", expect=CareRecipe)


def test_recipe_built_in_python_equals_the_minimal_yaml(tmp_path):
    from medadapt.care.sections import CareRecipe, DocumentSection, PrunedQuerySection
    from medadapt.recipes import DataSection, load_recipe

    path = tmp_path / "care-min.yaml"
    path.write_text("kind: care\nname: care-min\ndata: {path: medmini}\ndocument: {model: minilm}\n"
                    "query: {kind: pruned, layers: 2}\n")
    from_yaml = load_recipe(path)
    built = CareRecipe(name="care-min", data=DataSection(path="medmini"), document=DocumentSection(model="minilm"),
                       query=PrunedQuerySection(layers=2))
    assert type(from_yaml) is CareRecipe
    assert from_yaml.model_dump() == built.model_dump()
    # the defaults every phase takes (CARE Table 17) and the splits from data.train_split
    assert (built.stage1.lr, built.stage1.warmup_ratio, built.stage2.negatives) == (1e-4, 0.05, 7)
    assert built.stage1_splits() == ["train"] and built.stage2_split() == built.init_split() == "train"
    assert built.model_copy(update={"data": DataSection(path="x", train_split="dev")}).stage2_split() == "dev"


def _overrides(qwen, bert, beir) -> list[str]:
    return [f"document.model={qwen}", f"query.model={bert}", f"data.path={beir}"]


NO_TRAINING = ["init.query=null", "init.document=null", "stage1.enabled=false", "stage2.enabled=false"]


def test_tiny_recipe_runs_every_phase_beats_untrained_and_resumes(tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir,
                                                                  tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.care import has_lora, route_modules
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    qwen = tiny_qwen2_dir
    out = tmp_path / "run"
    overrides = _overrides(qwen, tiny_bert_dir, tiny_beir_dir) + ["stage2.epochs=4"]
    cache = EmbeddingCache(tmp_path / "cache")
    result = run_recipe(RECIPES / "care-tiny.yaml", out, overrides, cache=cache, **QUIET)
    stages = result.details["stages"]
    # 12 train pairs / batch 8 -> 2 init steps; 24 stage-I texts (12 queries + 12 documents) x 2 epochs / 8 -> 6;
    # 12 pairs x 4 epochs / batch 4 -> 12 stage-II steps
    assert {k: v["steps"] for k, v in stages.items()} == {"init_document": 2, "init_query": 2, "stage1": 6,
                                                          "stage2": 12}
    assert [r["stage"] for r in result.loss_history] == ["init_document"] * 2 + ["init_query"] * 2 + \
        ["stage1"] * 6 + ["stage2"] * 12
    assert json.loads((out / "metrics.json").read_text())["ndcg@10"] == pytest.approx(result.metrics["ndcg@10"],
                                                                                       abs=1e-6)
    log = json.loads((out / "train_log.json").read_text())
    assert log["stages"] == stages and len(log["loss_history"]) == 22
    checkpoints = tmp_path / "run.checkpoints"  # beside the model folder, one folder per phase
    assert sorted(p.name for p in checkpoints.iterdir()) == ["init_document", "init_query", "stage1", "stage2"]
    assert not (out / "checkpoints").exists()
    model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    assert not has_lora(route_modules(model, "document")[0])  # merged on save
    assert model.encode_query(["gout"]).shape == model.encode_document(["gout"]).shape == (1, 32)

    # the same towers without any training retrieve worse on the held-out test queries (measured: nDCG@10
    # 0.462 vs 0.369; 0.449 vs 0.369 with seed 1)
    untrained = run_recipe(RECIPES / "care-tiny.yaml", tmp_path / "untrained", overrides + NO_TRAINING,
                           cache=cache, **QUIET)
    assert untrained.details["stages"] == {} and untrained.loss_history == []
    assert result.metrics["ndcg@10"] > untrained.metrics["ndcg@10"] + 0.05

    # a second run resumes every phase from its final checkpoint and reproduces the model exactly
    again = run_recipe(RECIPES / "care-tiny.yaml", out, overrides, cache=cache, **QUIET)
    assert again.metrics == result.metrics
    assert again.loss_history == result.loss_history
    assert again.train_seconds < result.train_seconds


def test_rerun_with_another_recipe_is_refused_unless_overwrite(tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir, tmp_path):
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe
    from medadapt.training.loop import TrainingError

    qwen = tiny_qwen2_dir
    overrides = _overrides(qwen, tiny_bert_dir, tiny_beir_dir) + ["init.query=null", "init.document=null",
                                                                  "stage2.enabled=false"]
    kw = {"cache": EmbeddingCache(tmp_path / "cache"), "evaluate": False, **QUIET}
    first = run_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides, **kw)
    with pytest.raises(TrainingError, match="another run"):
        run_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides + ["stage1.lr=0.01"], **kw)
    redone = run_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides + ["stage1.lr=0.01"],
                        overwrite=True, **kw)
    assert redone.details["stages"]["stage1"]["steps"] == first.details["stages"]["stage1"]["steps"] == 6
    assert redone.loss_history[1]["loss"] != pytest.approx(first.loss_history[1]["loss"], abs=1e-6)


@pytest.mark.parametrize("query", ["{kind: pruned, layers: 1}", "{kind: static}"])
def test_tiny_recipe_with_pruned_or_static_query_tower_and_frozen_documents(query, tiny_qwen2_dir, tiny_beir_dir,
                                                                           tmp_path):
    from sentence_transformers import SentenceTransformer

    from medadapt.care import evaluate_asymmetric
    from medadapt.care.model import build_document_tower
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.recipes import load_recipe, run_recipe

    qwen = tiny_qwen2_dir
    overrides = [f"document.model={qwen}", f"data.path={tiny_beir_dir}", f"query={query}", "init.query=null",
                 "init.document=null", "stage2.train_document=false", "architecture.truncate_to=null"]
    result = run_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides,
                        cache=EmbeddingCache(tmp_path / "cache"), **QUIET)
    assert set(result.details["stages"]) == {"stage1", "stage2"}
    model = SentenceTransformer(str(tmp_path / "run"), device="cpu", trust_remote_code=True)
    assert model.encode_query(["gout"]).shape == model.encode_document(["gout"]).shape == (1, 48)
    # the document tower stayed frozen: the saved model encodes documents as the untrained tower does
    recipe = load_recipe(RECIPES / "care-tiny.yaml", overrides)
    document = build_document_tower(recipe.document, "cpu")
    texts = ["gout is a condition", "asthma inhaler"]
    assert model.encode_document(texts) == pytest.approx(document.encode_document(texts), abs=1e-5)
    # the reported metrics are those of the saved folder, evaluated afresh
    data = load_beir(tiny_beir_dir, ["test"])
    fresh = evaluate_asymmetric(model, data, "test", ["ndcg@10", "recall@10"], cache=EmbeddingCache(tmp_path / "c2"))
    assert fresh == pytest.approx(result.metrics, abs=1e-5)


def test_stage2_align_weight_replays_stage1_and_needs_stage1(tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir, tmp_path):
    from medadapt.errors import ConfigError
    from medadapt.recipes import load_recipe, run_recipe

    with pytest.raises(ConfigError, match="stage2.align_weight > 0 .* needs stage1.enabled: true"):
        load_recipe(RECIPES / "care-tiny.yaml", ["stage1.enabled=false", "stage2.align_weight=1"])
    assert load_recipe(RECIPES / "care-tiny.yaml").stage2.align_weight == 0  # the paper's stage II by default
    qwen = tiny_qwen2_dir
    overrides = [f"document.model={qwen}", f"data.path={tiny_beir_dir}", "query={kind: pruned, layers: 1}",
                 "init.query=null", "init.document=null", "stage2.train_document=false",
                 "architecture.truncate_to=null", "stage2.align_weight=0.5", "stage1.distill_weight=1"]
    from medadapt.cache import EmbeddingCache

    result = run_recipe(RECIPES / "care-tiny.yaml", tmp_path / "run", overrides,
                        cache=EmbeddingCache(tmp_path / "cache"), **QUIET)
    assert {"asym_infonce", "mse", "rank_kl"} == set(result.details["stages"]["stage1"]["last_parts"])
    parts = result.details["stages"]["stage2"]["last_parts"]  # the replay carries the distillation too
    assert {"asym_infonce", "align_asym_infonce", "align_mse", "align_rank_kl"} == set(parts)


def test_plan_notes_the_ranking_distillation_table():
    from medadapt.care.plan import plan_spec
    from medadapt.recipes import load_recipe

    assert not any("ranking distillation" in n for n in plan_spec(load_recipe(RECIPES / "care.yaml")).notes)
    notes = plan_spec(load_recipe(RECIPES / "care.yaml", ["stage1.distill_weight=1"])).notes
    assert any("ranking distillation" in n and "not counted" in n for n in notes)
