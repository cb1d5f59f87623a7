"""``medadapt data ...`` end to end on tiny offline data (BM25 / tiny BERT, fake judges and generator)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medadapt.cli import app

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("_isolated_cache")


def invoke(*args):
    result = runner.invoke(app, ["data", *map(str, args)])
    return result, result.output


def lines(path):
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def test_mine_bm25_writes_flagembedding_jsonl(tiny_beir_dir, tmp_path):
    out = tmp_path / "mined.jsonl"
    res, text = invoke("mine", "--data", tiny_beir_dir, "--split", "train", "--retriever", "bm25",
                       "--preset", "med-moe", "--window", "1-10", "--output", out, "-q")
    assert res.exit_code == 0, text
    rows = lines(out)
    assert rows and set(rows[0]) == {"query", "pos", "neg", "pos_scores", "neg_scores"}
    assert "training groups" in text
    res2, _ = invoke("mine", "--data", tiny_beir_dir, "--split", "train", "--retriever", "bm25",
                     "--preset", "med-moe", "--window", "1-10", "--output", tmp_path / "again.jsonl", "-q")
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()


def test_mine_errors_are_one_line(tiny_beir_dir, tmp_path):
    res, text = invoke("mine", "--data", tiny_beir_dir, "--window", "a-b", "--output", tmp_path / "x.jsonl")
    assert res.exit_code == 1 and "error: --window must look like 20-100" in text
    res, text = invoke("mine", "--data", tiny_beir_dir, "--window", "9-3", "--output", tmp_path / "x.jsonl")
    assert res.exit_code == 1 and "window must satisfy" in text and len(text.strip().splitlines()) == 1
    res, text = invoke("mine", "--data", tmp_path / "nope", "--output", tmp_path / "x.jsonl")
    assert res.exit_code == 1 and "not found" in text
    assert not (tmp_path / "x.jsonl").exists()


def test_filter_keeps_consistent_pairs(tmp_path):
    groups = [
        {"query": "asthma inhaler wheezing", "pos": ["Asthma: wheezing, use an inhaler."]},
        {"query": "gout toe pain", "pos": ["Migraine brings aura and nausea."]},  # inconsistent
    ]
    inp = tmp_path / "syn.jsonl"
    inp.write_text("\n".join(json.dumps(g) for g in groups))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"_id": f"c{i}", "text": t}) for i, t in enumerate(
        ["Gout strikes the big toe with pain.", "Gout toe pain relief.", "Toe pain from gout crystals."])))
    out = tmp_path / "kept.jsonl"
    res, text = invoke("filter", "--input", inp, "--corpus", corpus, "--retriever", "bm25", "--top-k", 3,
                       "--output", out, "-q")
    assert res.exit_code == 0, text
    assert [r["query"] for r in lines(out)] == ["asthma inhaler wheezing"] and "kept 1 of 2" in text


def test_dedup_with_tiny_model(tiny_bert_dir, tmp_path):
    inp = tmp_path / "queries.jsonl"
    texts = ["symptoms of gout", "symptoms of gout", "symptoms of gout", "asthma inhaler", "eczema cream"]
    inp.write_text("\n".join(json.dumps({"_id": str(i), "text": t}) for i, t in enumerate(texts)))
    out, disc, rep = tmp_path / "kept.jsonl", tmp_path / "disc.jsonl", tmp_path / "rep.json"
    res, text = invoke("dedup", "--input", inp, "--model", tiny_bert_dir, "--seed-size", 0, "--threshold", 0.999,
                       "--output", out, "--discarded", disc, "--report", rep, "-q")
    assert res.exit_code == 0, text
    assert [r["_id"] for r in lines(disc)] == ["2"]  # third exact copy: 2 neighbours above τ > m=1
    assert len(lines(out)) == 4 and json.loads(rep.read_text())["discarded"] == 1
    res, text = invoke("dedup", "--input", inp, "--model", tiny_bert_dir, "--max-neighbors", 5, "--output", out)
    assert res.exit_code == 1 and "must be < k" in text
    res, text = invoke("dedup", "--input", inp, "--field", "body", "--model", tiny_bert_dir, "--output", out)
    assert res.exit_code == 1 and "queries.jsonl:1: missing field 'body'" in text


FAKES = textwrap.dedent('''
    GRADES = {"j1": "SDA", "j2": "SDC", "j3": "ADD"}

    class _Judge:
        def __init__(self, name):
            self.name = name

        def __call__(self, query, passages):
            return [GRADES[self.name][int(p[-1])] for p in passages]

    j1, j2, j3 = _Judge("j1"), _Judge("j2"), _Judge("j3")

    def generator(ex):
        return {"positive": ex.replace_query, "hard_negative": ex.replace + " cause?",
                "easy_negative": ex.origin + " cure?"}
''')


def test_label_and_sts_with_fake_plugins(tmp_path, monkeypatch):
    (tmp_path / "fake_curation_plugins.py").write_text(FAKES)
    monkeypatch.syspath_prepend(str(tmp_path))
    inp = tmp_path / "cands.jsonl"
    inp.write_text(json.dumps({"query": "q", "passages": ["p0", "p1", "p2"]}))
    out, rep = tmp_path / "labels.jsonl", tmp_path / "rep.json"
    judges = [a for j in ("j1", "j2", "j3") for a in ("--judge", f"fake_curation_plugins:{j}")]
    res, text = invoke("label", "--input", inp, *judges, "--output", out, "--report", rep, "-q")
    assert res.exit_code == 0, text
    assert [(r["passage"], r["label"]) for r in lines(out)] == [("p0", 1), ("p1", 0)]  # p2 partial: dropped
    assert "Fleiss' kappa" in text and json.loads(rep.read_text())["dropped"] == 1
    res, text = invoke("label", "--input", inp, *judges, "--policy", "majority", "--format", "groups",
                       "--output", out, "-q")
    assert res.exit_code == 0, text
    assert lines(out) == [{"query": "q", "pos": ["p0"], "neg": ["p1", "p2"]}]  # p2: A, C, D -> 2 of 3 negative
    res, text = invoke("label", "--input", inp, "--judge", "fake_curation_plugins:j1", "--output", out)
    assert res.exit_code == 1 and "at least two --judge" in text
    res, text = invoke("label", "--input", inp, "--judge", "nomodule:x", "--judge", "openai:m", "--output", out)
    assert res.exit_code == 1 and "cannot import judge" in text

    syn, sents, trip = tmp_path / "syn.tsv", tmp_path / "sents.txt", tmp_path / "sts.jsonl"
    syn.write_text("hypertension\thigh blood pressure\n")
    sents.write_text("is hypertension hereditary?\nflu shot timing?\n")
    res, text = invoke("sts-triplets", "--synonyms", syn, "--sentences", sents, "--generator",
                       "fake_curation_plugins:generator", "--format", "pairs", "--output", trip, "-q")
    assert res.exit_code == 0, text
    rows = lines(trip)
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.0]
    assert rows[0]["sentence2"] == "is high blood pressure hereditary?"


@pytest.mark.parametrize("first, second, spelling", [
    ("--output", "--discarded", "o.jsonl"),
    ("--output", "--report", "./o.jsonl"),
    ("--discarded", "--report", "link.jsonl"),
])
def test_dedup_refuses_two_outputs_that_are_one_file_before_any_work(tmp_path, monkeypatch, first, second,
                                                                     spelling):
    """`data dedup --output o.jsonl --discarded o.jsonl` reported success and left o.jsonl empty; now it is
    one error line naming both options, before the input or the model is read (the model here does not
    exist), and the file is as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(json.dumps({"_id": "1", "text": "gout"}) + "\n")
    (tmp_path / "o.jsonl").write_text("OLD\n")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "o.jsonl")
    outputs = {"--output": "other.jsonl", first: "o.jsonl", second: spelling}
    args = [x for option, path in outputs.items() for x in (option, path)]
    res, text = invoke("dedup", "--input", "in.jsonl", "--model", "no-such-model", *args, "-q")
    assert res.exit_code == 1 and "Traceback" not in text
    assert [line for line in text.splitlines() if line.strip()] == [
        f"error: cannot write {second} {Path(spelling)}: it is also {first} (o.jsonl), another output of the "
        "same call; give each output its own path"]
    assert (tmp_path / "o.jsonl").read_text() == "OLD\n" and (tmp_path / "link.jsonl").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "link.jsonl", "o.jsonl"]
