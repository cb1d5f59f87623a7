from __future__ import annotations

import json

import pytest

from medadapt.data import load_beir, load_rerank, load_sts, load_training_groups
from medadapt.errors import DataError


def test_load_beir_graded(tiny_beir_dir):
    data = load_beir(tiny_beir_dir)
    assert set(data.qrels) == {"test", "train"}
    assert data.qrels["test"]["q0"] == {"d0": 1, "d1": 2}
    assert data.doc_text("d0").startswith("diabetes diabetes is")  # title + text
    assert list(data.split_queries("test"))[:2] == ["q0", "q1"]


def test_load_single_split(tiny_beir_dir):
    data = load_beir(tiny_beir_dir, "test")
    assert list(data.qrels) == ["test"]
    with pytest.raises(DataError, match="not loaded"):
        data.split_queries("train")


def test_missing_qrels_names_available_splits(tiny_beir_dir):
    with pytest.raises(DataError, match=r"qrels file not found: .*dev.tsv \(available splits: test, train\)"):
        load_beir(tiny_beir_dir, "dev")


def test_malformed_json_names_file_and_line(tiny_beir_dir):
    path = tiny_beir_dir / "queries.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, '{"_id": "x", "text": ')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"queries.jsonl:3: invalid JSON"):
        load_beir(tiny_beir_dir)


def test_empty_corpus(tiny_beir_dir):
    (tiny_beir_dir / "corpus.jsonl").write_text("\n")
    with pytest.raises(DataError, match="corpus is empty"):
        load_beir(tiny_beir_dir)


def test_unknown_ids_in_qrels(tiny_beir_dir):
    with open(tiny_beir_dir / "qrels" / "test.tsv", "a") as f:
        f.write("q1\tnot-a-doc\t1\n")
    with pytest.raises(DataError, match=r"1 document id\(s\) not in corpus.jsonl.*not-a-doc"):
        load_beir(tiny_beir_dir, "test")
    with open(tiny_beir_dir / "qrels" / "train.tsv", "a") as f:
        f.write("ghost\td1\t1\n")
    with pytest.raises(DataError, match=r"query id\(s\) not in queries.jsonl"):
        load_beir(tiny_beir_dir, "train")


def test_missing_field(tmp_path, tiny_beir_dir):
    (tiny_beir_dir / "corpus.jsonl").write_text('{"_id": "a", "title": "t"}\n')
    with pytest.raises(DataError, match=r"corpus.jsonl:1: missing field 'text'"):
        load_beir(tiny_beir_dir)


def test_training_groups(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [
        {"query": "q", "pos": ["p"], "neg": ["n1", "n2"], "neg_scores": [0.3, 0.1], "prompt": "Represent: "},
        {"query": "q2", "pos": ["p2", "p3"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    groups = load_training_groups(path)
    assert groups[0].neg == ["n1", "n2"] and groups[0].neg_scores == [0.3, 0.1]
    assert groups[1].neg == [] and groups[1].prompt is None
    assert groups[1].to_dict() == {"query": "q2", "pos": ["p2", "p3"], "neg": []}
    path.write_text(json.dumps({"query": "q", "pos": []}))
    with pytest.raises(DataError, match="at least one passage"):
        load_training_groups(path)
    path.write_text(json.dumps({"query": "q", "pos": ["a"], "neg": ["b"], "neg_scores": [1, 2]}))
    with pytest.raises(DataError, match="'neg_scores' must be 1 numbers"):
        load_training_groups(path)


def test_sts_and_rerank(tmp_path):
    sts = tmp_path / "sts.jsonl"
    sts.write_text('{"sentence1": "a", "sentence2": "b", "score": 4.5}\n{"sentence1": "c", "sentence2": "d", "score": 1}\n')
    pairs = load_sts(sts)
    assert pairs[1].score == 1.0
    sts.write_text('{"sentence1": "a", "sentence2": "b", "score": "high"}\n')
    with pytest.raises(DataError, match="field 'score' must be int/float"):
        load_sts(sts)
    rr = tmp_path / "rerank.jsonl"
    rr.write_text(json.dumps({"query": "q", "candidates": [{"text": "x", "grade": 2}, {"text": "y"}]}) + "\n")
    items = load_rerank(rr)
    assert items[0].grades == [2, 0]
    rr.write_text(json.dumps({"query": "q", "candidates": []}) + "\n")
    with pytest.raises(DataError, match="'candidates' is empty"):
        load_rerank(rr)


def test_builtin_dataset_is_consistent():
    data = load_beir("medmini")
    assert len(data.corpus) >= 150
    assert {"train", "dev", "test"} <= set(data.qrels)
    test_q, train_q = set(data.qrels["test"]), set(data.qrels["train"])
    assert not test_q & train_q
    assert len(load_sts(data.root / "sts.jsonl")) >= 50
