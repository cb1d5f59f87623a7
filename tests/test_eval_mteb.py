"""MTEB provenance of medadapt models (``medadapt.eval.mteb``, issue 44): ``model_meta.json`` names the base a
run was trained from (``adapted_from``) and its training data as MTEB task names (``training_datasets``:
MedQuAD -> MedicalQARetrieval), local data by its recipe name beside it; a task in the training data gives one
leak warning (mteb's own zero-shot test); ``--mteb-task`` scores heads, CARE Routers and hybrid models (their
dense side, said in the output)."""

from __future__ import annotations

import json
import warnings
from functools import partial

import pytest

mteb = pytest.importorskip("mteb")

from mteb.models import ModelMeta  # noqa: E402

import medadapt
from _helpers import RECIPES, tiny_system_recipe
from conftest import build_tiny_beir
from medadapt.cli import _show_warning, app
from medadapt.data import load_beir
from medadapt.errors import MedAdaptWarning
from medadapt.eval import evaluate_retrieval
from medadapt.eval.mteb import (
    PROVENANCE_FILE,
    Provenance,
    local_retrieval_task,
    model_provenance,
    mteb_tasks_for,
    recipe_base_model,
    recipe_training_data,
    run_mteb,
)
from medadapt.models import model_fingerprint
from medadapt.yaml_input import read_yaml

pytestmark = pytest.mark.usefixtures("_single_thread")


@pytest.fixture(scope="module")
def medquad(tmp_path_factory):
    """A tiny BEIR folder called ``medquad``: a run trained on it has trained on MedQuAD."""
    return build_tiny_beir(tmp_path_factory.mktemp("data") / "medquad")


@pytest.fixture(scope="module")
def runs(tiny_bert_dir, tiny_qwen2_dir, medquad, tmp_path_factory):
    """Three run folders trained by the tiny recipes: a MoE head (adapter-only), CARE (a Router of a tiny BERT
    query tower and a tiny Qwen2 document tower with LoRA, stage II only) and a composed hybrid (MoE head +
    HyReC learned-lexical branch)."""
    from medadapt.recipes import run_recipe

    root = tmp_path_factory.mktemp("runs")
    qwen = tiny_qwen2_dir
    out = {}
    care_stage2_only = ["init.query=null", "init.document=null", "stage1.enabled=false"]  # seconds, not tens
    for kind, name, extra in (("moe", "head", []), ("care", "care", care_stage2_only), ("moe-hybrid", "hybrid", [])):
        recipe, overrides = tiny_system_recipe(kind, tiny_bert_dir, qwen, medquad)
        run_recipe(recipe, root / name, [*overrides, *extra], evaluate=False, show_progress=False,
                   log=lambda _m: None)
        out[name] = root / name
    out["qwen"] = qwen
    return out


def _cli(args, monkeypatch, tmp_path):
    """``medadapt ARGS`` in process, medadapt warnings printed as the console script prints them."""
    from typer.testing import CliRunner

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(warnings, "showwarning", partial(_show_warning, _default=warnings.showwarning))
    with warnings.catch_warnings():
        warnings.simplefilter("default", MedAdaptWarning)
        return CliRunner().invoke(app, args)


def _warnings(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("warning:")]


@pytest.mark.parametrize(("name", "tasks"), [
    ("medquad", ("MedicalQARetrieval",)), ("../shared/data/medquad", ("MedicalQARetrieval",)),
    ("medquad-mini", ("MedicalQARetrieval",)), ("data/finetune/MedQuAD.jsonl", ("MedicalQARetrieval",)),
    ("healthcaremagic", ("ChatDoctorRetrieval",)), ("cmedqa2", ("CMedQAv2-reranking",)),
    ("nfcorpus", ("NFCorpus",)), ("msmarco.jsonl", ("MSMARCO",)), ("CMedQAv1-reranking", ("CMedQAv1-reranking",)),
    ("medmini", ()), ("questiondoctors", ()), ("tiny-beir", ()),
])
def test_data_set_names_map_to_mteb_tasks(name, tasks):
    assert mteb_tasks_for(name) == tasks


@pytest.mark.parametrize(("recipe", "base", "data"), [
    ("medical-multidomain.yaml", "sentence-transformers/all-MiniLM-L6-v2",
     {"../shared/data/medquad": ("MedicalQARetrieval",), "../shared/data/questiondoctors": ()}),
    ("care.yaml", "Qwen/Qwen3-4B", {"../shared/data/medquad": ("MedicalQARetrieval",)}),
    ("hyrec-tiny.yaml", "sentence-transformers/all-MiniLM-L6-v2", {"medmini": ()}),
    ("bmretriever-tiny.yaml", "medadapt/tiny-qwen2", {"tiny-beir": ()}),
])
def test_shipped_recipes_name_their_base_and_training_data(recipe, base, data, tmp_path):
    read, _ = read_yaml(RECIPES / recipe)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "recipe.yaml").write_text((RECIPES / recipe).read_text())
    prov = model_provenance(tmp_path / "run")
    assert recipe_base_model(read) and prov.adapted_from == base
    assert prov.training_data == data and recipe_training_data(read) == list(data)


def test_bmretriever_recipe_maps_each_training_set():
    read, _ = read_yaml(RECIPES / "bmretriever-410m.yaml")
    tasks = {t for name in recipe_training_data(read) for t in mteb_tasks_for(name)}
    assert {"MedicalQARetrieval", "ChatDoctorRetrieval", "MSMARCO", "NQ", "FEVER", "HotpotQA"} <= tasks
    assert not {t for t in tasks if t in ("NFCorpus", "SciFact", "TRECCOVID")}  # eval sets are not training data


def test_mteb_output_writes_the_runs_provenance(runs, medquad, tiny_bert_dir, tmp_path, monkeypatch):
    out = tmp_path / "mteb"
    res = _cli(["eval", "--model", str(runs["head"]), "--data", str(medquad), "--split", "test",
                "--mteb-output", str(out), "-q"], monkeypatch, tmp_path)
    assert res.exit_code == 0, res.output
    assert _warnings(res.output) == []  # the local task "medquad" is the held-out split, not an MTEB task
    metas = list(out.rglob("model_meta.json"))
    assert len(metas) == 1
    text = metas[0].read_text()
    meta = json.loads(text)
    model = medadapt.load(str(runs["head"]))
    assert meta["name"] == "medadapt/head" and meta["revision"] == model_fingerprint(model)
    assert meta["adapted_from"] == f"local/{tiny_bert_dir.name}"
    assert meta["training_datasets"] == ["MedicalQARetrieval"]
    assert meta["embed_dim"] == 32 and meta["similarity_fn_name"] == "cosine" and meta["use_instructions"] is False
    assert ModelMeta.model_validate_json_resolved(text).adapted_from == meta["adapted_from"]  # mteb reads it
    side, _ = read_yaml(metas[0].parent / PROVENANCE_FILE)
    assert side["training_data"] == {str(medquad): ["MedicalQARetrieval"]} and side["local_training_data"] == []
    assert side["read"] == ["medadapt_adapter.json", "recipe.yaml"]
    loaded = mteb.ResultCache(cache_path=str(out)).load_results()  # the extra file is not taken for a result
    assert [r.task_name for m in loaded.model_results for r in m.task_results] == ["medquad"]


def test_scoring_a_training_task_warns_once(runs, medquad, tmp_path, monkeypatch):
    args = ["eval", "--model", str(runs["head"]), "--data", str(medquad), "--split", "test", "-q", "--mteb-task"]
    res = _cli([*args, "MedicalQARetrieval"], monkeypatch, tmp_path)
    assert res.exit_code == 0, res.output
    assert _warnings(res.output) == [
        f"warning: MTEB task MedicalQARetrieval is in the training data of medadapt/head (the run trained on "
        f"{medquad}): its score is not zero-shot (model_meta.json's training_datasets says so)"]
    res = _cli([*args, "NFCorpus"], monkeypatch, tmp_path)
    assert res.exit_code == 0, res.output
    assert _warnings(res.output) == []


@pytest.mark.parametrize("kind", ["head", "care", "hybrid"])
def test_mteb_task_scores_heads_care_and_hybrid_models(kind, runs, medquad, tiny_bert_dir, tmp_path, monkeypatch):
    folder = runs[kind]
    out = tmp_path / "mteb"
    res = _cli(["eval", "--model", str(folder), "--mteb-task", "NFCorpus", "--data", str(medquad), "--split", "test",
                "--output", str(tmp_path / "n.json"), "--mteb-output", str(out), "-q"], monkeypatch, tmp_path)
    assert res.exit_code == 0, res.output
    model = medadapt.load(str(folder))
    ours = evaluate_retrieval(model, load_beir(medquad, ["test"]), "test", ["ndcg@10"], show_progress=False)
    assert json.loads((tmp_path / "n.json").read_text())["ndcg@10"] == pytest.approx(ours["ndcg@10"], abs=2e-3)
    notes = [line for line in res.output.splitlines() if line.startswith("note:")]
    if kind == "hybrid":
        assert notes == [f"note: {folder.name} is a hybrid model (hyrec: dense + learned-lexical); mteb scores its "
                         "dense side, the model medadapt.load gives (medadapt eval --mode hybrid scores both)"]
    else:
        assert notes == []
    meta = json.loads(next(out.rglob("model_meta.json")).read_text())
    base = runs["qwen"] if kind == "care" else tiny_bert_dir  # CARE: the document tower
    assert meta["adapted_from"] == f"local/{base.name}" and meta["training_datasets"] == ["MedicalQARetrieval"]
    assert meta["embed_dim"] == model.get_embedding_dimension() == 32


def test_local_data_is_kept_by_name_and_a_bad_recipe_is_one_warning(tiny_bert_dir, tmp_path):
    from medadapt.moe import MoEConfig

    model = medadapt.load(str(tiny_bert_dir))
    model.add_adapter(MoEConfig.paper(dim=32, expansion=2), adapter_name="med")
    run = tmp_path / "run"
    medadapt.save_adapter(model, run)
    (run / "recipe.yaml").write_text("kind: moe\nname: run\ndata: {path: ../my-notes, mix: [{path: medquad-mini}]}\n")
    beir = build_tiny_beir(tmp_path / "beir")
    loaded = medadapt.load(str(run))
    result = run_mteb(loaded, local_retrieval_task(beir, "test"), output=tmp_path / "out", source=run)
    assert result["provenance"]["local_training_data"] == ["../my-notes"]
    assert result["provenance"]["training_datasets"] == ["MedicalQARetrieval"] and result["zero_shot"] is True
    meta = json.loads(next((tmp_path / "out").rglob("model_meta.json")).read_text())
    assert meta["training_datasets"] == ["MedicalQARetrieval"]
    side, _ = read_yaml(next((tmp_path / "out").rglob(PROVENANCE_FILE)))
    assert side["training_data"] == {"../my-notes": [], "medquad-mini": ["MedicalQARetrieval"]}
    (run / "recipe.yaml").write_text("kind: moe\ndata: [unclosed\n")
    with pytest.warns(MedAdaptWarning, match="recipe.yaml.*records no training data"):
        prov = model_provenance(run)
    assert prov.training_data is None and prov.training_datasets is None
    assert prov.adapted_from == f"local/{tiny_bert_dir.name}"  # the adapter config still names the base


def test_mteb_registry_training_data_counts_for_a_base_and_a_known_model(tiny_bert_dir, tmp_path):
    """mteb's registry lists MS MARCO in all-MiniLM-L6-v2's training data: a head on it is not zero-shot there,
    nor is the model itself (no medadapt run: its registry entry is used); NFCorpus is zero-shot for both."""
    beir = build_tiny_beir(tmp_path / "beir")
    msmarco = local_retrieval_task(beir, "test", like="MSMARCO")
    model = medadapt.load(str(tiny_bert_dir))
    minilm = "sentence-transformers/all-MiniLM-L6-v2"
    prov = Provenance(adapted_from=minilm, training_data={"my-notes": ()})
    head = f"local/{tiny_bert_dir.name}"
    with pytest.warns(MedAdaptWarning, match=f"^MTEB task MSMARCO is in the training data of {head} \\(its base "
                                             f"model {minilm} was trained on it, per mteb's model registry\\): "
                                             "its score is not zero-shot"):
        assert run_mteb(model, msmarco, provenance=prov)["zero_shot"] is False
    with pytest.warns(MedAdaptWarning, match=f"^MTEB task MSMARCO is in the training data of {minilm} \\(its "
                                             "training_datasets list it, or a task mteb derives it from\\)"):
        assert run_mteb(model, msmarco, name=minilm)["zero_shot"] is False
    with warnings.catch_warnings():
        warnings.simplefilter("error", MedAdaptWarning)
        nfcorpus = local_retrieval_task(beir, "test", like="NFCorpus")
        assert run_mteb(model, nfcorpus, provenance=prov)["zero_shot"] is True
        assert run_mteb(model, nfcorpus, name=minilm)["zero_shot"] is True
        assert run_mteb(model, nfcorpus)["zero_shot"] is None  # a local folder with no recipe: unknown
