"""The C-MTEB retrieval suite as HyReC evaluates it (``--suite cmteb``): eight BEIR tasks on the dev split,
nDCG@10 / Recall@10 / MRR@10 / MAP@10 checked against pytrec_eval computed here from the model's own
embeddings, the paper's average, and one error listing every missing task."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import pytrec_eval
from typer.testing import CliRunner

from medadapt.errors import DataError, MedAdaptWarning
from medadapt.eval.suites import evaluate_suite, get_suite

pytestmark = pytest.mark.usefixtures("_single_thread")

TASKS = ("T2Retrieval", "MMarcoRetrieval", "DuRetrieval", "CovidRetrieval", "CmedqaRetrieval", "EcomRetrieval",
         "MedicalRetrieval", "VideoRetrieval")
WORDS = ["diabetes insulin glucose", "asthma inhaler wheezing", "migraine headache aura", "eczema itchy rash",
         "gout uric toe", "anemia iron pale", "insomnia sleep night", "influenza fever flu", "fever cough cold",
         "rash skin itch", "sleep apnea snore", "iron diet pale", "glucose sugar blood"]


def write_task(root: Path, offset: int) -> dict:
    """A BEIR folder of 13 documents (more than the cut-off 10) and 5 queries with graded dev qrels;
    returns its qrels."""
    root.mkdir(parents=True)
    docs = {f"d{i}": f"{WORDS[(offset + i) % len(WORDS)]} text" for i in range(len(WORDS))}
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n"
                                               for d, t in docs.items()))
    queries = {f"q{i}": f"{WORDS[(offset + 2 * i) % len(WORDS)].split()[1]} question" for i in range(5)}
    (root / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items()))
    qrels = {f"q{i}": {f"d{2 * i}": 2, f"d{(2 * i + 5) % 13}": 1} for i in range(5)}
    (root / "qrels").mkdir()
    (root / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{d}\t{g}\n" for q, rel in qrels.items() for d, g in rel.items()))
    return {"qrels": qrels, "docs": docs, "queries": queries}


@pytest.fixture()
def cmteb(tmp_path):
    return tmp_path / "cmteb", {name: write_task(tmp_path / "cmteb" / name, i) for i, name in enumerate(TASKS)}


@pytest.fixture()
def model(tiny_bert):
    tiny_bert.model_card_data.language = ["zh"]
    return tiny_bert


def by_hand(model, task: dict) -> dict[str, float]:
    """pytrec_eval on the cosine run of the whole corpus (the top 10 for MRR@10)."""
    dids, qids = list(task["docs"]), list(task["queries"])
    d = model.encode_document([task["docs"][i] for i in dids], normalize_embeddings=True)
    q = model.encode_query([task["queries"][i] for i in qids], normalize_embeddings=True)
    scores = np.asarray(q) @ np.asarray(d).T
    run = {qid: {did: float(s) for did, s in zip(dids, row)} for qid, row in zip(qids, scores)}
    top10 = {qid: dict(sorted(r.items(), key=lambda kv: -kv[1])[:10]) for qid, r in run.items()}
    ev = pytrec_eval.RelevanceEvaluator(task["qrels"], {"ndcg_cut.10", "recall.10", "map_cut.10"})
    per = ev.evaluate(run)
    rr = pytrec_eval.RelevanceEvaluator(task["qrels"], {"recip_rank"}).evaluate(top10)

    def mean(values):
        return math.fsum(values) / len(values)

    return {"ndcg@10": mean([v["ndcg_cut_10"] for v in per.values()]),
            "recall@10": mean([v["recall_10"] for v in per.values()]),
            "map@10": mean([v["map_cut_10"] for v in per.values()]),
            "mrr@10": mean([v["recip_rank"] for v in rr.values()])}


def test_suite_is_the_papers_eight_tasks_and_averages():
    spec = get_suite("cmteb")
    assert [t.name for t in spec.tasks] == list(TASKS)
    assert all(t.main_metric == "ndcg@10" and t.query_instruction is None for t in spec.tasks)
    assert {a.name for a in spec.averages} == {"avg", "avg_recall@10", "avg_mrr@10", "avg_map@10"}


def test_scores_equal_pytrec_eval_by_hand(cmteb, model, tmp_path):
    from medadapt.cache import EmbeddingCache

    root, tasks = cmteb
    res = evaluate_suite("cmteb", model, root, "dev", cache=EmbeddingCache(tmp_path / "cache"))
    assert [r.task for r in res.rows] == list(TASKS) and res.split == "dev"
    expected = {name: by_hand(model, task) for name, task in tasks.items()}
    for r in res.rows:
        assert r.main_metric == "ndcg@10" and r.query_prompt is None
        for metric, value in expected[r.task].items():
            assert r.metrics[metric] == pytest.approx(value, abs=1e-6), (r.task, metric)
    assert len({round(r.main_score, 6) for r in res.rows}) > 1  # the tasks differ, so the average means something
    assert res.averages["avg"] == pytest.approx(math.fsum(e["ndcg@10"] for e in expected.values()) / 8, abs=1e-6)
    assert res.averages["avg_mrr@10"] == pytest.approx(
        math.fsum(e["mrr@10"] for e in expected.values()) / 8, abs=1e-6)


def test_missing_tasks_are_one_error_listing_them(cmteb, model):
    root, _ = cmteb
    shutil.rmtree(root / "DuRetrieval")
    shutil.rmtree(root / "VideoRetrieval")
    with pytest.raises(DataError, match=r"2 of 8 task folders missing .*: DuRetrieval, VideoRetrieval"):
        evaluate_suite("cmteb", model, root, "dev")
    res = evaluate_suite("cmteb", model, root, "dev", tasks=["T2Retrieval", "CovidRetrieval"])
    assert [r.task for r in res.rows] == ["T2Retrieval", "CovidRetrieval"] and res.averages["avg"] is None


def test_the_test_split_points_at_dev(cmteb, model):
    with pytest.raises(DataError, match="use --split dev"):
        evaluate_suite("cmteb", model, cmteb[0], "test")


def test_cli_suite(cmteb, tiny_bert_dir, tmp_path, monkeypatch):
    from medadapt.cli import app

    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "r.json"
    with pytest.warns(MedAdaptWarning, match="declares no language"):
        result = CliRunner().invoke(app, ["eval", "--suite", "cmteb", "--data-dir", str(cmteb[0]), "--split",
                                          "dev", "--model", str(tiny_bert_dir), "--output", str(out), "-q",
                                          "--suite-tasks", "T2Retrieval,MedicalRetrieval"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["suite"] == "cmteb" and [t["task"] for t in data["tasks"]] == ["T2Retrieval", "MedicalRetrieval"]
    assert set(data["tasks"][0]["metrics"]) == {"ndcg@10", "recall@10", "mrr@10", "map@10"}
