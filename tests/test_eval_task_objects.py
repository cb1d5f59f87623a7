"""Evaluation tasks as objects (medadapt.eval.tasks): each kind through ``evaluate(model, task)`` gives the same
numbers as the lower-level evaluator it replaced, a suite of task objects gives the same numbers as the tasks
run one by one, an index and a dense model in hybrid mode are scored through the same entry point, and a task
kind registered from outside (one class) runs in a suite."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import build_tiny_bert
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Router

import medadapt
from medadapt.cache import EmbeddingCache
from medadapt.care.evaluate import evaluate_asymmetric
from medadapt.data import load_beir, load_rerank, load_sts
from medadapt.errors import MedAdaptError
from medadapt.eval import (
    evaluate_pool,
    evaluate_recommendation,
    evaluate_rerank,
    evaluate_retrieval,
    evaluate_run,
    evaluate_sts,
    load_pool_task,
    load_recommendation,
)
from medadapt.eval.suites import SuiteSpec, TaskSpec, evaluate_suite
from medadapt.eval.tasks import EvalTask, TaskMetadata, evaluate, register_task_kind, task_kind, task_kinds
from medadapt.eval.tasks import base as tasks_base
from medadapt.eval.tasks import retrieval as tasks_retrieval
from medadapt.eval.tasks.retrieval import retriever_metrics, sparse_encoder, supported_modes
from medadapt.hyrec.evaluate import evaluate_hyrec
from medadapt.hyrec.model import HyReCConfig, HyReCModel
from medadapt.recipes.run import evaluate_dense
from medadapt.retrieval import Retriever, load_documents

pytestmark = pytest.mark.usefixtures("_single_thread")

WORDS = ["diabetes insulin glucose", "asthma inhaler wheezing", "migraine headache aura", "eczema itchy rash",
         "gout uric toe", "anemia iron pale"]


def _jsonl(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _files(root: Path) -> dict[str, Path]:
    """One file per file kind, each in the layout ``--data`` reads (``<dir>/<kind>.jsonl``)."""
    return {
        "rerank": _jsonl(root / "rerank.jsonl", [{"query": f"what helps {w.split()[0]}", "candidates": [
            {"text": f"{w} treatment", "grade": 1}, {"text": WORDS[(i + 1) % 6], "grade": 0},
            {"text": WORDS[(i + 2) % 6], "grade": 0}]} for i, w in enumerate(WORDS[:4])]),
        "sts": _jsonl(root / "sts.jsonl", [{"sentence1": WORDS[i], "sentence2": WORDS[(i + k) % 6],
                                            "score": float(3 - k)} for i in range(4) for k in range(3)]),
        "qa": _jsonl(root / "qa.jsonl", [{"query": f"what is {WORDS[i].split()[0]}", "positives": [WORDS[i]],
                                          "negatives": [WORDS[(i + 3) % 6]], "id": f"p{i}"} for i in range(3)]),
        "entity-linking": _jsonl(root / "entity-linking.jsonl", [{"query": WORDS[i].split()[0], "positives": [
            f"{WORDS[i]} definition"]} for i in range(4)]),
        "recommendation": _jsonl(root / "recommendation.jsonl", [{"query": WORDS[i], "candidates": [
            {"text": f"{WORDS[i]} study", "grade": 2}, {"text": WORDS[(i + 1) % 6], "grade": 1},
            {"text": WORDS[(i + 3) % 6], "grade": 0}]} for i in range(3)]),
    }


def test_every_kind_is_registered_and_a_metadata_names_a_known_kind():
    assert {"retrieval", "rerank", "sts", "qa", "entity-linking", "pool", "recommendation"} <= set(task_kinds())
    assert task_kind("qa").default_metrics == ("recall@5", "recall@20", "ndcg@20")
    assert TaskMetadata("x", "entity-linking").main_metric == "recall@1"  # the kind's metrics, the first main
    with pytest.raises(ValueError, match="task kind must be one of"):
        TaskMetadata("x", "clustering")


def test_each_kind_gives_the_old_evaluators_numbers(tiny_bert, tiny_beir_dir, tmp_path):
    """``evaluate(model, task)`` against the function each kind's path called before, on the same files."""
    files = _files(tmp_path / "data")
    cache = EmbeddingCache(tmp_path / "cache")

    def run(kind, data, **kw):
        task = task_kind(kind).create(kind).load_data(data, "test")
        return evaluate(tiny_bert, task, cache=cache, **kw).metrics

    old = {
        "retrieval": evaluate_retrieval(tiny_bert, load_beir(tiny_beir_dir, ["test"]), "test", cache=cache,
                                        show_progress=False),
        "rerank": evaluate_rerank(tiny_bert, load_rerank(files["rerank"])),
        "sts": evaluate_sts(tiny_bert, load_sts(files["sts"])),
        "qa": evaluate_pool(tiny_bert, load_pool_task(files["qa"])),
        "entity-linking": evaluate_pool(tiny_bert, load_pool_task(files["entity-linking"]),
                                        ("recall@1", "recall@5", "mrr@5")),
        "recommendation": evaluate_recommendation(tiny_bert, load_recommendation(files["recommendation"])),
    }
    new = {"retrieval": run("retrieval", tiny_beir_dir), **{k: run(k, tmp_path / "data") for k in files}}
    assert new == old  # identical, not approximately: the same computation
    assert set(new["recommendation"]) == {"map", "ndcg", "skipped"} and 0 < new["qa"]["ndcg@20"] <= 1
    # STS through the query route gives another number on a prompted model: the options reach the kind
    tiny_bert.prompts = {"query": "a question: "}
    sts = task_kind("sts").create("sts").load_data(files["sts"])
    assert evaluate(tiny_bert, sts, route="query").metrics == evaluate_sts(tiny_bert, load_sts(files["sts"]),
                                                                           route="query")
    assert evaluate(tiny_bert, sts, route="query").metrics != evaluate(tiny_bert, sts).metrics


def test_a_suite_of_task_objects_gives_the_single_task_numbers(tiny_bert, tiny_beir_dir, tmp_path):
    """A suite naming every kind: each row equals ``evaluate`` of that task alone (and so the old path above)."""
    root = tmp_path / "suite"
    for kind, path in _files(tmp_path / "flat").items():
        (root / kind).mkdir(parents=True)
        path.rename(root / kind / "test.jsonl")
    beir = load_beir(tiny_beir_dir, ["test"])
    retrieval = root / "retrieval"
    (retrieval / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        (retrieval / name).write_bytes((tiny_beir_dir / name).read_bytes())
    (retrieval / "qrels" / "test.tsv").write_bytes((tiny_beir_dir / "qrels" / "test.tsv").read_bytes())
    spec = SuiteSpec("all-kinds", "every kind", tuple(TaskSpec(kind, kind) for kind in
                                                      ("retrieval", "rerank", "sts", "qa", "entity-linking",
                                                       "recommendation")))
    assert all(isinstance(t, EvalTask) for t in spec.tasks)  # a suite is a list of task objects
    cache = EmbeddingCache(tmp_path / "cache")
    tiny_bert.model_card_data.language = ["en"]
    res = evaluate_suite(spec, tiny_bert, root, cache=cache, instructions="off")
    for task in spec.tasks:
        alone = evaluate(tiny_bert, task.load(root, "test"), cache=cache).metrics
        assert res.row(task.name).metrics == {m: alone[m] for m in task.metrics}
    assert res.row("retrieval").metrics == evaluate_retrieval(tiny_bert, beir, "test", cache=cache,
                                                              show_progress=False)


def test_an_index_and_a_dense_model_in_hybrid_mode(tiny_bert, tiny_bert_dir, tiny_beir_dir, tmp_path):
    data = load_beir(tiny_beir_dir, ["test"])
    task = task_kind("retrieval").create("beir").load_data(tiny_beir_dir, "test")
    cache = EmbeddingCache(tmp_path / "cache")
    metrics = ["ndcg@10", "recall@10"]

    def by_hand(retriever):
        queries = data.split_queries("test")
        hits = retriever.batch_search(list(queries.values()), 100)
        return evaluate_run(data.qrels["test"], {q: {h.id: h.score for h in r} for q, r in zip(queries, hits)},
                            metrics)

    index = Retriever.build(load_documents(tiny_beir_dir), SentenceTransformer(str(tiny_bert_dir), device="cpu"),
                            kind="hybrid", show_progress=False)
    assert supported_modes(index) == ("dense", "lexical", "hybrid") and supported_modes(tiny_bert) == ("dense",
                                                                                                      "hybrid")
    assert evaluate(index, task, metrics=metrics).metrics == pytest.approx(by_hand(index), abs=1e-9)
    hybrid = evaluate(tiny_bert, task, metrics=metrics, mode="hybrid", cache=cache).metrics
    assert hybrid == pytest.approx(by_hand(index), abs=1e-6)  # dense + BM25 built in memory = the hybrid index
    dense = evaluate(tiny_bert, task, metrics=metrics, cache=cache).metrics
    assert evaluate(index, task, metrics=metrics, mode="dense").metrics == pytest.approx(dense, abs=1e-6)
    assert retriever_metrics(index, data, "test", metrics) == evaluate(index, task, metrics=metrics).metrics
    with pytest.raises(MedAdaptError, match="mode lexical: SentenceTransformer supports dense or hybrid"):
        evaluate(tiny_bert, task, mode="lexical", cache=cache)


def test_evaluate_refuses_what_a_task_cannot_do(tiny_bert, tmp_path):
    files = _files(tmp_path)
    sts = task_kind("sts").create("sts")
    with pytest.raises(MedAdaptError, match="holds no data: load it first"):
        evaluate(tiny_bert, sts)
    sts = sts.load_data(files["sts"])
    with pytest.raises(MedAdaptError, match="mode hybrid applies to retrieval tasks, not to sts"):
        evaluate(tiny_bert, sts, mode="hybrid")
    with pytest.raises(MedAdaptError, match="metrics do not apply to sts .it reports pearson and spearman"):
        evaluate(tiny_bert, sts, metrics=["pearson"])


def test_a_task_kind_from_outside_is_one_class(tiny_bert, tmp_path, monkeypatch):
    """Adding a kind: one class registering itself; a suite names it, ``evaluate`` runs it."""
    monkeypatch.setattr(tasks_base, "_KINDS", dict(tasks_base._KINDS))  # the toy kind stays in this test

    @register_task_kind
    class LengthTask(EvalTask):  # a toy kind: the mean query-embedding norm of one JSONL file
        kind = "toy-norm"
        default_metrics = ("norm",)

        def read(self, path):
            return [json.loads(line)["text"] for line in Path(path).read_text().splitlines()]

        def score(self, model, settings):
            emb = model.encode_query(self.data, convert_to_numpy=True)
            return {"en": {"norm": float((emb ** 2).sum(1).mean() ** 0.5)}}

    _jsonl(tmp_path / "norms" / "test.jsonl", [{"text": w} for w in WORDS])
    spec = SuiteSpec("toy", "toy suite", (TaskSpec("norms", "toy-norm"),))
    tiny_bert.model_card_data.language = ["en"]
    res = evaluate_suite(spec, tiny_bert, tmp_path, instructions="off")
    by_hand = float((tiny_bert.encode_query(WORDS, convert_to_numpy=True) ** 2).sum(1).mean() ** 0.5)
    assert res.row("norms").main_metric == "norm" and res.row("norms").main_score == pytest.approx(by_hand)
    assert res.row("norms").metrics == evaluate(tiny_bert, spec.task("norms").load(tmp_path, "test")).metrics


def test_a_recipes_dense_evaluation_goes_through_the_task(tiny_bert, tiny_beir_dir, tmp_path):
    cache = EmbeddingCache(tmp_path / "cache")
    recipe = SimpleNamespace(eval=SimpleNamespace(data=None, split="test", metrics=["ndcg@10", "mrr@10"]),
                             data=SimpleNamespace(path=str(tiny_beir_dir)), resolve=Path,
                             training=SimpleNamespace(encode_batch_size=8))
    ctx = SimpleNamespace(cache=cache, show_progress=False)
    assert evaluate_dense(recipe, tiny_bert, ctx) == evaluate_retrieval(
        tiny_bert, load_beir(tiny_beir_dir, ["test"]), "test", ["ndcg@10", "mrr@10"], cache=cache, batch_size=8,
        show_progress=False)


def test_an_asymmetric_model_is_scored_through_its_two_towers(tiny_beir_dir, tmp_path):
    """A Router model (CARE's layout) needs no evaluator of its own: ``evaluate`` gives CARE's
    ``evaluate_asymmetric`` numbers, and they differ from either tower alone."""
    q_st = SentenceTransformer(str(build_tiny_bert(tmp_path / "q", seed=1)), device="cpu")
    d_st = SentenceTransformer(str(build_tiny_bert(tmp_path / "d", seed=2)), device="cpu")
    router = Router.for_query_document(query_modules=list(q_st._modules.values())[:-1],
                                       document_modules=list(d_st._modules.values())[:-1])
    asym = SentenceTransformer(modules=[router, Normalize()], device="cpu")
    task = task_kind("retrieval").create("beir").load_data(tiny_beir_dir, "test")
    cache = EmbeddingCache(tmp_path / "cache")
    metrics = ["ndcg@10", "mrr@10", "recall@100"]
    got = evaluate(asym, task, metrics=metrics, cache=cache).metrics
    assert got == pytest.approx(evaluate_asymmetric(asym, task.dataset, "test", metrics, cache=cache), abs=1e-6)
    assert got != evaluate(q_st, task, metrics=metrics, cache=cache).metrics
    assert got != evaluate(d_st, task, metrics=metrics, cache=cache).metrics


def test_a_learned_sparse_model_in_every_mode_gives_hyrecs_own_numbers(tiny_bert_dir, tiny_beir_dir, tmp_path,
                                                                      monkeypatch):
    """A model with HyReC's learned-lexical branch is scored in every mode through ``evaluate``; its generic
    path (an in-memory Retriever over its encoder, used when no scorer is registered for its tag) gives
    ``evaluate_hyrec``'s metrics, so HyReC's system could drop its registered scorer without a change."""
    monkeypatch.setattr(tasks_retrieval, "_SPARSE_SCORERS", {})  # the generic path, whatever is registered
    monkeypatch.setattr(tasks_retrieval, "registered", lambda: [])  # ... HyReC's system scorer included
    torch.manual_seed(0)
    cfg = HyReCConfig(branch_layers=1, language="en", pooling="mean", n_word_buckets=1000, query_max_length=16,
                      passage_max_length=48)
    hyrec = HyReCModel.from_backbone(str(tiny_bert_dir), cfg)
    with torch.no_grad():  # sparse vectors with several active terms, so the lexical side ranks
        hyrec.weight_proj.linear.weight.normal_(0.0, 0.5)
        hyrec.weight_proj.linear.bias.fill_(0.5)
        hyrec.union_proj.linear.bias.copy_(torch.tensor([2.0, 0.0, 0.0, 0.0]))
    hyrec.save(tmp_path / "hyrec")
    model = medadapt.load(str(tmp_path / "hyrec"), device="cpu")
    assert supported_modes(model) == ("dense", "lexical", "hybrid") and sparse_encoder(model) is not None
    task = task_kind("retrieval").create("beir").load_data(tiny_beir_dir, "test")
    cache = EmbeddingCache(tmp_path / "cache")
    metrics = ["ndcg@10", "recall@100", "mrr@10"]
    scores = {}
    for mode in ("lexical", "dense", "hybrid"):
        scores[mode] = evaluate(model, task, mode=mode, metrics=metrics, cache=cache).metrics
        own = evaluate_hyrec(sparse_encoder(model), task.dataset, "test", mode, metrics, cache=cache,
                             show_progress=False)
        assert scores[mode] == pytest.approx({m: own[m] for m in metrics}, abs=1e-9), mode
    assert scores["lexical"] != scores["dense"]  # the sides differ: the comparison has power
    assert evaluate(model, task, metrics=metrics, cache=cache).metrics == scores["hybrid"]  # the default mode
