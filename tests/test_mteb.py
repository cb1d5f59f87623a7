"""The mteb package itself evaluates medadapt models on a local BEIR folder (no download) and agrees with
``medadapt eval``; saved models carry a name and a revision that keep them apart in mteb's result cache."""

from __future__ import annotations

import json

import pytest

mteb = pytest.importorskip("mteb")

import medadapt
from medadapt.data import load_beir
from medadapt.errors import MedAdaptError
from medadapt.eval import evaluate_retrieval
from medadapt.eval.mteb import (
    local_retrieval_task,
    model_identity,
    named_task,
    result_path,
    run_mteb,
)

pytestmark = pytest.mark.usefixtures("_single_thread")


@pytest.fixture()
def beir(tmp_path):
    """Unique ids, graded qrels (2 and 1), queries with one and with two relevant documents, and a query
    that shares no word with its document (the models must rank, not just match)."""
    from conftest import write_beir

    corpus = {
        "d0": ("diabetes", "blood sugar insulin thirst urination glucose"),
        "d1": ("asthma", "wheezing inhaler airway breath cough"),
        "d2": ("migraine", "headache aura light nausea throbbing"),
        "d3": ("", "itchy skin rash dry cream dermatitis eczema"),
        "d4": ("gout", "toe uric acid crystals purine attack"),
        "d5": ("anemia", "iron tired pale hemoglobin red cells"),
        "d6": ("insomnia", "sleep night awake tired bedtime routine"),
    }
    queries = {"q0": "symptoms of diabetes thirst", "q1": "asthma inhaler cough", "q2": "headache light",
               "q3": "rash on the skin", "q4": "tired and pale", "q5": "night sleep", "q6": "toe attack"}
    qrels = {"q0": {"d0": 2, "d5": 1}, "q1": {"d1": 1}, "q2": {"d2": 2}, "q3": {"d3": 1, "d0": 0},
             "q4": {"d5": 2, "d6": 1}, "q5": {"d6": 1}, "q6": {"d4": 1}}
    return write_beir(tmp_path / "beir", corpus, queries, {"test": qrels})


def _ours(model, root) -> float:
    return evaluate_retrieval(model, load_beir(root, ["test"]), "test", ["ndcg@10"], show_progress=False)["ndcg@10"]


def _theirs(model, root, out=None, **kw) -> dict:
    return run_mteb(model, local_retrieval_task(root, "test"), output=out, **kw)


def _moe_model(tiny_bert_dir, tmp_path, name="moe-run", seed=0):
    """The tiny BERT with a MoE head whose output layer is perturbed (zero-initialised it is the identity),
    saved as an adapter-only folder and loaded back with ``medadapt.load``."""
    import torch

    from medadapt.moe import MoEConfig

    model = medadapt.load(str(tiny_bert_dir))
    head = model.add_adapter(MoEConfig.paper(dim=32, expansion=2), adapter_name="med")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    folder = tmp_path / name
    medadapt.save_adapter(model, folder)
    return medadapt.load(str(folder)), model


def test_local_task_reads_the_folder_and_refuses_repeated_ids(beir, tmp_path):
    task = local_retrieval_task(beir, "test")
    split = task.dataset["default"]["test"]
    assert task.metadata.name == "beir" and task.metadata.main_score == "ndcg_at_10"
    assert sorted(split["queries"]["id"]) == [f"q{i}" for i in range(7)]
    assert split["relevant_docs"]["q0"] == {"d0": 2, "d5": 1}
    texts = dict(zip(split["corpus"]["id"], split["corpus"]["title"]))
    assert texts["d3"] == "" and texts["d0"] == "diabetes"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "corpus.jsonl").write_text((beir / "corpus.jsonl").read_text())
    (bad / "queries.jsonl").write_text((beir / "queries.jsonl").read_text()
                                       + json.dumps({"_id": "q0", "text": "another text"}) + "\n")
    (bad / "qrels").mkdir()
    (bad / "qrels" / "test.tsv").write_text((beir / "qrels" / "test.tsv").read_text())
    with pytest.raises(MedAdaptError, match="q0"):
        local_retrieval_task(bad, "test")


def test_mteb_matches_medadapt_for_a_moe_head(tiny_bert_dir, beir, tmp_path):
    loaded, _ = _moe_model(tiny_bert_dir, tmp_path)
    ours = _ours(loaded, beir)
    plain = _ours(medadapt.load(str(tiny_bert_dir)), beir)
    assert abs(ours - plain) > 1e-3  # the head changes the ranking: the check below has power
    result = _theirs(loaded, beir)
    assert result["medadapt"]["ndcg@10"] == pytest.approx(ours, abs=2e-3)
    assert result["main_score"] == pytest.approx(ours, abs=2e-3)
    assert result["model"] == "medadapt/moe-run"


def _asym(q_dir, d_dir):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Router

    q = SentenceTransformer(str(q_dir), device="cpu")
    d = SentenceTransformer(str(d_dir), device="cpu")
    router = Router.for_query_document(query_modules=list(q._modules.values())[:-1],
                                       document_modules=list(d._modules.values())[:-1])
    return SentenceTransformer(modules=[router, Normalize()], device="cpu")


def test_mteb_matches_medadapt_for_an_asymmetric_router(beir, tmp_path_factory):
    from conftest import build_tiny_bert

    q_dir = build_tiny_bert(tmp_path_factory.mktemp("q"), seed=1)
    d_dir = build_tiny_bert(tmp_path_factory.mktemp("d"), seed=2)
    model = _asym(q_dir, d_dir)
    ours = _ours(model, beir)
    swapped = _ours(_asym(d_dir, q_dir), beir)
    assert abs(ours - swapped) > 1e-3  # the routes matter: mteb must send queries and documents apart
    result = _theirs(model, beir)
    assert result["medadapt"]["ndcg@10"] == pytest.approx(ours, abs=2e-3)


def test_mteb_matches_medadapt_with_query_and_document_prompts(tiny_bert_dir, beir):
    """A BMRetriever-style instruction model: ``query`` / ``document`` prompts and dot-product similarity on
    unnormalised embeddings."""
    from sentence_transformers import SentenceTransformer

    base = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    prompts = {"query": "given a question, retrieve the passage that answers it : ",
               "document": "passage about : "}
    model = SentenceTransformer(modules=list(base._modules.values())[:-1], device="cpu", prompts=prompts,
                                similarity_fn_name="dot")
    bare = SentenceTransformer(modules=list(base._modules.values())[:-1], device="cpu", similarity_fn_name="dot")
    ours = _ours(model, beir)
    assert abs(ours - _ours(bare, beir)) > 1e-3  # the prompts change the ranking
    result = _theirs(model, beir)
    assert result["medadapt"]["ndcg@10"] == pytest.approx(ours, abs=2e-3)


def test_cached_encoder_gives_mteb_the_same_embeddings(tiny_bert_dir, beir, tmp_path):
    from medadapt.cache import EmbeddingCache

    loaded, _ = _moe_model(tiny_bert_dir, tmp_path)
    cache = EmbeddingCache(tmp_path / "cache")
    direct = _theirs(loaded, beir)
    cached = _theirs(loaded, beir, use_cache=True, cache=cache)
    assert cached["medadapt"] == pytest.approx(direct["medadapt"], abs=1e-5)
    assert cached["medadapt"]["ndcg@10"] == pytest.approx(_ours(loaded, beir), abs=2e-3)
    assert any((tmp_path / "cache").rglob("*.safetensors"))  # it really read / filled medadapt's cache


def test_load_gives_name_and_revision(tiny_bert_dir, tmp_path):
    plain = medadapt.load(str(tiny_bert_dir))
    assert plain.model_card_data.model_name == f"local/{tiny_bert_dir.name}"
    assert plain.model_card_data.base_model_revision == model_identity(plain)[1]
    a, _ = _moe_model(tiny_bert_dir, tmp_path, name="run-a", seed=0)
    b, _ = _moe_model(tiny_bert_dir, tmp_path, name="run-b", seed=1)
    assert a.model_card_data.model_name == "medadapt/run-a"
    assert b.model_card_data.model_name == "medadapt/run-b"
    assert a.model_card_data.base_model_revision != b.model_card_data.base_model_revision
    assert a.model_card_data.base_model_revision != plain.model_card_data.base_model_revision
    again = medadapt.load(str(tmp_path / "run-a"))
    assert again.model_card_data.base_model_revision == a.model_card_data.base_model_revision
    full = tmp_path / "full"
    a.save(str(full))
    (full / "recipe.yaml").write_text("kind: moe\n")
    loaded_full = medadapt.load(str(full))
    assert loaded_full.model_card_data.model_name == "medadapt/full"
    assert loaded_full.model_card_data.base_model_revision == a.model_card_data.base_model_revision


def test_two_models_get_two_mteb_result_entries(tiny_bert_dir, beir, tmp_path):
    """Before, both were filed under ``no_model_name_available`` and mteb returned the first model's score
    for the second. Here mteb itself (``mteb.evaluate`` on the plain SentenceTransformer, no medadapt
    wrapper) reads the name and revision ``medadapt.load`` set."""
    a, _ = _moe_model(tiny_bert_dir, tmp_path, name="run-a", seed=0)
    b, _ = _moe_model(tiny_bert_dir, tmp_path, name="run-b", seed=1)
    cache = mteb.ResultCache(cache_path=str(tmp_path / "mteb"))
    task = local_retrieval_task(beir, "test")
    got = [mteb.evaluate(m, task, cache=cache, overwrite_strategy="only-missing",
                         encode_kwargs={"batch_size": 8}, show_progress_bar=False).task_results[0]
           for m in (a, b)]
    ours = [_ours(m, beir) for m in (a, b)]
    assert abs(ours[0] - ours[1]) > 1e-4
    for result, expected in zip(got, ours):
        assert result.get_score() == pytest.approx(expected, abs=2e-3)
    files = sorted(p.relative_to(tmp_path / "mteb" / "results").as_posix()
                   for p in (tmp_path / "mteb" / "results").rglob("beir.json"))
    assert len(files) == 2 and files[0].split("/")[0] == "medadapt__run-a" and files[1].split("/")[0] == "medadapt__run-b"


def test_run_mteb_writes_result_files_and_named_task_from_a_beir_folder(tiny_bert_dir, beir, tmp_path):
    model = medadapt.load(str(tiny_bert_dir))
    out = tmp_path / "mteb-out"
    result = run_mteb(model, named_task("NFCorpus", beir, "test"), output=out)
    path = result_path(out, result)
    assert path.is_file() and path.name == "NFCorpus.json"
    saved = json.loads(path.read_text())
    assert saved["task_name"] == "NFCorpus"
    assert saved["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(_ours(model, beir), abs=2e-3)
    assert (path.parent / "model_meta.json").is_file()


def test_named_task_from_a_local_copy_of_its_dataset_repository(tiny_bert_dir, beir, tmp_path):
    """mteb's own loader reads a local copy of the task's Hugging Face repository (the layout of the
    ``mteb/<task>`` datasets: corpus, queries and qrels configs); the registered task keeps its hub path."""
    from datasets import Dataset

    data = load_beir(beir, ["test"])
    root = tmp_path / "nfcorpus-repo"
    qrels = [(q, d, g) for q, docs in data.qrels["test"].items() for d, g in docs.items()]
    tables = {
        "corpus": {"_id": data.doc_ids, "title": [data.corpus[d]["title"] for d in data.doc_ids],
                   "text": [data.corpus[d]["text"] for d in data.doc_ids]},
        "queries": {"_id": list(data.queries), "text": list(data.queries.values())},
        "default": {"query-id": [q for q, _, _ in qrels], "corpus-id": [d for _, d, _ in qrels],
                    "score": [g for _, _, g in qrels]},
    }
    configs = []
    for config, rows in tables.items():
        (root / config).mkdir(parents=True)
        Dataset.from_dict(rows).to_parquet(str(root / config / "test.parquet"))
        configs.append(f"- config_name: {config}\n  data_files:\n  - split: test\n    path: {config}/test.parquet")
    (root / "README.md").write_text("---\nconfigs:\n" + "\n".join(configs) + "\n---\n")
    task = named_task("NFCorpus", root, "test")
    model = medadapt.load(str(tiny_bert_dir))
    assert run_mteb(model, task)["main_score"] == pytest.approx(_ours(model, beir), abs=2e-3)
    assert mteb.get_task("NFCorpus").metadata.dataset["path"] != str(root.resolve())


def test_named_task_errors(beir, tmp_path):
    with pytest.raises(MedAdaptError, match="unknown MTEB task"):
        named_task("NoSuchTaskAnywhere", beir)
    with pytest.raises(MedAdaptError, match="not local"):
        named_task("NFCorpus", None, "test")  # the hub is offline in tests: a clear error, not a traceback
    (tmp_path / "empty").mkdir()
    with pytest.raises(MedAdaptError, match="neither a BEIR folder"):
        named_task("NFCorpus", tmp_path / "empty", "test")
    with pytest.raises(MedAdaptError, match="retrieval tasks only"):
        local_retrieval_task(beir, "test", like="STS12")


def test_cli_mteb_output_and_mteb_task(tiny_bert_dir, beir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from medadapt.cli import app

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    runner = CliRunner()
    out = tmp_path / "mteb-files"
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(beir), "--split", "test",
                              "--metrics", "ndcg@10", "--output", str(tmp_path / "r.json"), "--mteb-output", str(out),
                              "-q"])
    assert res.exit_code == 0, res.output
    files = list(out.rglob("beir.json"))
    assert len(files) == 1
    ours = json.loads((tmp_path / "r.json").read_text())["ndcg@10"]
    assert json.loads(files[0].read_text())["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(ours, abs=2e-3)
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--mteb-task", "NFCorpus", "--data", str(beir),
                              "--split", "test", "--output", str(tmp_path / "n.json")])  # bars on, not verbose
    assert res.exit_code == 0, res.output
    assert "it/s]" not in res.output  # no tqdm bar of mteb's: one set of bars (medadapt's own)
    assert json.loads((tmp_path / "n.json").read_text())["ndcg@10"] == pytest.approx(ours, abs=2e-3)
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--mteb-task", "NFCorpus", "--split", "test",
                              "-q"])
    assert res.exit_code == 1 and "error:" in res.output and "not local" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(beir), "--task", "sts",
                              "--mteb-output", str(out)])
    assert res.exit_code == 1 and "--mteb-output applies to --task retrieval" in res.output
