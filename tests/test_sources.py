from __future__ import annotations

import json
import os

import pytest

from medadapt.data import load_beir
from medadapt.data.sources import fold_counts, leave_one_source_out, query_sources
from medadapt.errors import DataError, MedAdaptError

# query id -> source; 3 sources, every query judged in exactly one split
QUERIES = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B", "b3": "B", "c1": "C", "c2": "C"}
QRELS = {
    "train": [("a1", "d1", 1), ("b1", "d4", 1), ("b1", "d5", 2), ("c1", "d7", 1)],
    "dev": [("a2", "d2", 1), ("b2", "d5", 1), ("c2", "d8", 1)],
    "test": [("a3", "d3", 1), ("b3", "d6", 1), ("c2", "d7", 1)],
}


@pytest.fixture
def beir(tmp_path):
    root = tmp_path / "src"
    (root / "qrels").mkdir(parents=True)
    with open(root / "corpus.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": f"d{i}", "title": "", "text": f"document {i}"}) + "\n" for i in range(1, 9))
    with open(root / "queries.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": q, "text": f"question {q}", "metadata": {"source": s}}) + "\n"
                     for q, s in QUERIES.items())
    for split, rows in QRELS.items():
        (root / "qrels" / f"{split}.tsv").write_text(
            "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in rows))
    return root


def test_query_sources(beir):
    assert query_sources(beir) == QUERIES
    assert query_sources(load_beir(beir, "test")) == QUERIES


def test_query_without_source_names_line(beir):
    path = beir / "queries.jsonl"
    lines = path.read_text().splitlines()
    lines[3] = json.dumps({"_id": "b1", "text": "question b1", "metadata": {"qtype": "x"}})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"queries.jsonl:4: query 'b1' has no metadata.source"):
        query_sources(beir)


def test_fold_qrels_by_hand(beir, tmp_path):
    out = leave_one_source_out(beir, "B", tmp_path / "fold")
    data = load_beir(out)
    assert sorted(data.qrels) == ["dev", "test-in", "test-out", "train"]
    assert data.qrels["train"] == {"a1": {"d1": 1}, "c1": {"d7": 1}}
    assert data.qrels["dev"] == {"a2": {"d2": 1}, "c2": {"d8": 1}}
    assert data.qrels["test-in"] == {"a3": {"d3": 1}, "c2": {"d7": 1}}
    # every question of the held-out source, from test, dev and train
    assert data.qrels["test-out"] == {"b3": {"d6": 1}, "b2": {"d5": 1}, "b1": {"d4": 1, "d5": 2}}
    assert len(data.corpus) == 8 and len(data.queries) == 8
    # shared by link, never copied
    for name in ("corpus.jsonl", "queries.jsonl"):
        p = out / name
        assert p.is_symlink() or os.stat(p).st_ino == os.stat(beir / name).st_ino
        assert os.path.samefile(p, beir / name)
    counts = fold_counts(out)
    assert counts["held_out"] == "B" and counts["train_sources"] == ["A", "C"]
    assert counts["splits"]["test-out"] == {"queries": 3, "judgements": 4, "per_source": {"B": 3}}
    assert counts["splits"]["test-in"]["per_source"] == {"A": 1, "C": 1}


def test_refold_replaces_folder(beir, tmp_path):
    out = tmp_path / "fold"
    leave_one_source_out(beir, "B", out)
    leave_one_source_out(beir, "A", out)
    data = load_beir(out)
    assert data.qrels["test-out"] == {"a3": {"d3": 1}, "a2": {"d2": 1}, "a1": {"d1": 1}}
    assert data.qrels["train"] == {"b1": {"d4": 1, "d5": 2}, "c1": {"d7": 1}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fold", "src"]  # no leftovers


def test_unknown_source_lists_sources_and_writes_nothing(beir, tmp_path):
    out = tmp_path / "fold"
    with pytest.raises(MedAdaptError, match=r"unknown source 'D'.*are: A, B, C"):
        leave_one_source_out(beir, "D", out)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_empty_split_refused_and_existing_fold_kept(beir, tmp_path):
    out = leave_one_source_out(beir, "B", tmp_path / "fold")
    before = (out / "qrels" / "train.tsv").read_text()
    # C is the only source with dev judgements besides A and B; drop A's and B's dev rows, hold out C
    (beir / "qrels" / "dev.tsv").write_text("query-id\tcorpus-id\tscore\nc2\td8\t1\n")
    with pytest.raises(DataError, match=r"holding out 'C' leaves the fold split\(s\) dev empty"):
        leave_one_source_out(beir, "C", out)
    assert (out / "qrels" / "train.tsv").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fold", "src"]
