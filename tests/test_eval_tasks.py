"""BMRetriever's evaluation tasks in ``medadapt.eval`` and ``medadapt eval``: QA and entity linking (pool
ranking), paper recommendation (per-query candidates, MAP / nDCG), and the ``--query-prompt`` option.

Metric values are checked on a stub model whose embeddings are fixed by hand, so the expected numbers are
exact; the CLI is exercised with the tiny random BERT of ``conftest``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from medadapt.cli import app

pytestmark = pytest.mark.filterwarnings("ignore")


class StubModel:
    """Embeds texts by table lookup; dot-product similarity; records the prompts it was asked for."""

    similarity_fn_name = "dot"

    def __init__(self, table: dict[str, list[float]]):
        self.table = table

    def _enc(self, texts, **_):
        return np.array([self.table[t] for t in texts], dtype=np.float32)

    encode_query = _enc
    encode_document = _enc


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_pool_task_metrics_are_exact(tmp_path):
    from medadapt.eval import ENTITY_LINKING_METRICS, QA_METRICS, evaluate_pool, load_pool_task
    from medadapt.eval.tasks.pool import build_pool

    # pool: A, B, C (+ distractor D). q1 -> A ranks 1st; q2 -> its positive B ranks 3rd (after D and A).
    f = _jsonl(tmp_path / "qa.jsonl", [
        {"query": "q1", "positives": ["A"], "id": "x"},
        {"query": "q2", "positives": ["B"], "negatives": ["D"]},
        {"query": "q3", "positives": ["C", "A"]},
    ])
    items = load_pool_task(f)
    assert [it.id for it in items] == ["x", "2", "3"]
    pool, qrels = build_pool(items)
    assert pool == ["A", "B", "D", "C"] and qrels["3"] == {"3": 1, "0": 1}
    model = StubModel({"q1": [1, 0, 0], "q2": [0, 1, 0], "q3": [0, 0, 1],
                       "A": [5, 0.5, 1], "B": [0, 1, 0], "D": [0, 3, 0], "C": [0, 0, 2]})
    # q2 scores: D 3, A 0.5, B 1 -> B is 2nd; q3 scores: C 2, A 1 -> both positives on top
    el = evaluate_pool(model, items, ENTITY_LINKING_METRICS)
    assert el["recall@1"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert el["recall@5"] == pytest.approx(1.0)
    assert el["mrr@5"] == pytest.approx((1 + 0.5 + 1) / 3)
    qa = evaluate_pool(model, items, QA_METRICS)
    assert set(qa) == {"recall@5", "recall@20", "ndcg@20"} and qa["recall@20"] == pytest.approx(1.0)
    assert qa["ndcg@20"] == pytest.approx((1 + 1 / math.log2(3) + 1) / 3)


def test_pool_task_bad_inputs(tmp_path):
    from medadapt.errors import DataError
    from medadapt.eval import load_pool_task

    with pytest.raises(DataError, match="positives"):
        load_pool_task(_jsonl(tmp_path / "a.jsonl", [{"query": "q", "positives": []}]))
    with pytest.raises(DataError, match="a.jsonl:1"):
        load_pool_task(_jsonl(tmp_path / "a.jsonl", [{"query": "q"}]))
    with pytest.raises(DataError, match="duplicate query id"):
        load_pool_task(_jsonl(tmp_path / "a.jsonl", [{"query": "q", "positives": ["p"], "id": 1},
                                                     {"query": "r", "positives": ["p"], "id": 1}]))


def test_recommendation_map_and_ndcg_are_exact(tmp_path):
    from medadapt.errors import DataError
    from medadapt.eval import evaluate_recommendation, load_recommendation

    f = _jsonl(tmp_path / "rec.jsonl", [
        {"query": "p1", "candidates": [{"text": "a", "grade": 2}, {"text": "b", "grade": 0},
                                       {"text": "c", "grade": 1}]},
        {"query": "p2", "candidates": [{"text": "a", "grade": 0}, {"text": "b", "grade": 0}]},
    ])
    items = load_recommendation(f)
    # p1 ranks b (3), c (2), a (1): relevant at ranks 2 and 3
    model = StubModel({"p1": [1.0], "p2": [1.0], "a": [1.0], "b": [3.0], "c": [2.0]})
    res = evaluate_recommendation(model, items)
    assert res["skipped"] == 1.0  # p2 has no relevant candidate
    assert res["map"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    dcg = 1 / math.log2(3) + 2 / math.log2(4)  # trec_eval gain = grade: c (1) at rank 2, a (2) at rank 3
    idcg = 2 + 1 / math.log2(3)
    assert res["ndcg"] == pytest.approx(dcg / idcg)
    with pytest.raises(DataError, match="grade"):
        load_recommendation(_jsonl(tmp_path / "b.jsonl", [{"query": "q", "candidates": [{"text": "a"},
                                                                                           {"text": "b"}]}]))
    with pytest.raises(DataError, match="at least 2"):
        load_recommendation(_jsonl(tmp_path / "b.jsonl", [{"query": "q", "candidates": [{"text": "a", "grade": 1}]}]))


def test_cli_runs_the_new_tasks_and_query_prompt(tiny_bert_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    runner = CliRunner()
    rows = [{"query": f"symptoms of {n}", "positives": [f"{n} is a condition"]} for n in
            ("diabetes", "asthma", "gout", "anemia")]
    _jsonl(tmp_path / "qa.jsonl", rows)
    _jsonl(tmp_path / "entity-linking.jsonl", rows)
    _jsonl(tmp_path / "recommendation.jsonl", [
        {"query": "diabetes insulin", "candidates": [{"text": "insulin glucose", "grade": 2},
                                                     {"text": "knee pain", "grade": 0}]}])
    expected = {"qa": {"recall@5", "recall@20", "ndcg@20"}, "entity-linking": {"recall@1", "recall@5", "mrr@5"},
                "recommendation": {"map", "ndcg", "skipped"}}
    for task, keys in expected.items():
        out = tmp_path / f"{task}.json"
        res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(tmp_path), "--task", task,
                                  "--output", str(out), "-q", "--query-prompt", r"Find the definition\nQuery: "])
        assert res.exit_code == 0, res.output
        got = json.loads(out.read_text())
        assert set(got) == keys and all(0 <= v <= 1 for k, v in got.items() if k != "skipped")
    assert json.loads((tmp_path / "qa.json").read_text())["recall@5"] == 1.0  # 4 passages in the pool
    _jsonl(tmp_path / "sts.jsonl", [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in
                                     [("gout", "gout toe", 4), ("asthma", "eczema", 1), ("flu", "flu fever", 5)]])
    sts = {}
    for prompt in ([], ["--query-prompt", "Given a sentence, retrieve sentences with the same meaning: "]):
        out = tmp_path / "sts.json"
        res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(tmp_path), "--task", "sts",
                                  "--output", str(out), "-q", *prompt])
        assert res.exit_code == 0, res.output
        sts[bool(prompt)] = json.loads(out.read_text())
    assert sts[True] != sts[False]  # the instruction reached both sentences
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(tmp_path), "--task",
                              "recommendation", "--metrics", "map@10", "-q"])
    assert res.exit_code != 0 and "does not apply" in res.output


def test_query_prompt_changes_the_query_encoding(tiny_bert_dir):
    """What ``--query-prompt`` sets: the model's ``query`` prompt, used by ``encode_query``."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    plain = model.encode_query(["gout"])
    model.prompts = {**(model.prompts or {}), "query": "Find the definition\nQuery: "}
    assert not np.allclose(model.encode_query(["gout"]), plain)
    assert np.allclose(model.encode_query(["gout"]), model.encode(["Find the definition\nQuery: gout"]), atol=1e-6)
