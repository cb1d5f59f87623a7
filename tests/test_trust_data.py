"""Bad data files and metric names give one clear error naming the file and the line, never a traceback,
a crash or silently wrong numbers: duplicate query ids, bytes that are not UTF-8, non-finite or
non-integer qrels grades, negative grades (pytrec_eval segfault), NaN STS scores, ids that would forge
TREC run lines, and absurd metric cutoffs."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medadapt.cli._index_run import read_queries
from medadapt.data import (StsPair, load_beir, load_corpus, load_qrels, load_queries, load_rerank, load_sts,
                           load_training_groups)
from medadapt.errors import ConfigError, DataError, MedAdaptError
from medadapt.eval import evaluate_run, evaluate_sts, parse_metric
from medadapt.recipes.loader import load_recipe, read_recipe_yaml

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
N_QUERIES = 24  # lines in the tiny BEIR queries.jsonl
N_DOCS = 12
N_TEST_QRELS = 13  # judgements in qrels/test.tsv, after its header line


def _append(path: Path, data: bytes | str) -> None:
    with open(path, "ab") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


def _jsonl(path: Path, rows: list) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


# -- 1. duplicate query ids ------------------------------------------------------------------------------


def test_duplicate_query_id_is_refused_with_file_and_line(tiny_beir_dir, tmp_path):
    _append(tiny_beir_dir / "queries.jsonl", json.dumps({"_id": "q0", "text": "something else"}) + "\n")
    with pytest.raises(DataError, match=rf"queries.jsonl:{N_QUERIES + 1}: duplicate query id 'q0'"):
        load_beir(tiny_beir_dir, "test")
    with pytest.raises(DataError, match=rf"queries.jsonl:{N_QUERIES + 1}: duplicate query id 'q0'"):
        read_queries(tiny_beir_dir / "queries.jsonl")  # `medadapt search --queries x.jsonl`
    tsv = tmp_path / "q.tsv"
    tsv.write_text("a\tasthma\n\nb\tgout\na\teczema\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"q.tsv:4: duplicate query id 'a'"):
        read_queries(tsv)
    tsv.write_text("a\tasthma\r\nb\tgout\r\n", encoding="utf-8")  # CRLF still reads
    assert read_queries(tsv) == {"a": "asthma", "b": "gout"}


# -- 2. bytes that are not UTF-8 ---------------------------------------------------------------------------


BAD_UTF8 = b'{"_id": "zz", "text": "caf\xe9 \xff\xfe"}\n'


@pytest.mark.parametrize("name, line, loader", [
    ("corpus.jsonl", N_DOCS + 1, lambda root: load_corpus(root / "corpus.jsonl")),
    ("queries.jsonl", N_QUERIES + 1, lambda root: load_queries(root / "queries.jsonl")),
    ("qrels/test.tsv", N_TEST_QRELS + 2, lambda root: load_qrels(root / "qrels" / "test.tsv")),
])
def test_non_utf8_beir_file_names_file_and_line(tiny_beir_dir, name, line, loader):
    _append(tiny_beir_dir / name, BAD_UTF8 if name.endswith(".jsonl") else b"q1\td\xe91\t1\n")
    with pytest.raises(DataError, match=rf"{re.escape(name)}:{line}: not valid UTF-8 \(byte \d+ of the line"):
        loader(tiny_beir_dir)
    with pytest.raises(DataError, match=rf"{re.escape(name)}:{line}: not valid UTF-8"):
        load_beir(tiny_beir_dir, "test")


def test_non_utf8_other_data_files(tmp_path):
    sts = tmp_path / "sts.jsonl"
    sts.write_bytes(b'{"sentence1": "a", "sentence2": "b", "score": 1}\n'
                    b'{"sentence1": "caf\xe9", "sentence2": "b", "score": 2}\n')
    with pytest.raises(DataError, match=r"sts.jsonl:2: not valid UTF-8 \(byte 19 of the line is b'\\xe9'\)"):
        load_sts(sts)
    rerank = tmp_path / "rerank.jsonl"
    rerank.write_bytes(b'{"query": "q\xff", "candidates": [{"text": "a", "grade": 1}]}\n')
    with pytest.raises(DataError, match=r"rerank.jsonl:1: not valid UTF-8"):
        load_rerank(rerank)
    train = tmp_path / "train.jsonl"
    train.write_bytes(b'{"query": "q", "pos": ["a"]}\n\n{"query": "\xc3", "pos": ["a"]}\n')
    with pytest.raises(DataError, match=r"train.jsonl:3: not valid UTF-8"):
        load_training_groups(train)
    tsv = tmp_path / "q.tsv"
    tsv.write_bytes(b"a\tasthma\nb\tgout \xff\n")
    with pytest.raises(DataError, match=r"q.tsv:2: not valid UTF-8"):
        read_queries(tsv)


def test_utf8_with_bom_and_non_ascii_text_still_loads(tiny_beir_dir):
    corpus = tiny_beir_dir / "corpus.jsonl"
    corpus.write_bytes(b"\xef\xbb\xbf" + corpus.read_bytes() + json.dumps(
        {"_id": "zh1", "text": "糖尿病 症状"}, ensure_ascii=False).encode("utf-8") + b"\n")
    docs = load_corpus(corpus)
    assert docs["zh1"]["text"] == "糖尿病 症状" and "d0" in docs


def test_non_utf8_recipe_is_a_config_error(tmp_path):
    raw = (RECIPES / "med-moe-embed-tiny.yaml").read_bytes()
    assert b"description: Med" in raw
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(raw.replace(b"description: Med", b"description: M\xe9\xff d", 1))
    offset = raw.index(b"description: Med") + len(b"description: M")
    line = raw[:offset].count(b"\n") + 1
    with pytest.raises(ConfigError, match=rf"bad.yaml:{line}: not valid UTF-8 \(byte offset {offset}\)"):
        read_recipe_yaml(bad)
    with pytest.raises(ConfigError, match="not valid UTF-8"):
        load_recipe(bad)


# -- 3. qrels grades ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("score, message", [
    ("inf", "is not an integer grade"),
    ("-Infinity", "is not an integer grade"),
    ("nan", "is not an integer grade"),
    ("1.5", "is not an integer grade"),
    ("1e400", "is not an integer grade"),
    ("high", "is not a number"),
    ("5000", "relevance grade 5000 is above 1000"),
    ("99999999999999999999", "is above 1000"),
])
def test_bad_qrels_grade_names_file_and_line(tiny_beir_dir, score, message):
    _append(tiny_beir_dir / "qrels" / "test.tsv", f"q1\td5\t{score}\n")
    with pytest.raises(DataError, match=rf"test.tsv:{N_TEST_QRELS + 2}: .*{re.escape(message)}"):
        load_qrels(tiny_beir_dir / "qrels" / "test.tsv")


def test_integer_valued_and_negative_grades_are_accepted(tiny_beir_dir):
    _append(tiny_beir_dir / "qrels" / "test.tsv", "q1\td5\t2.0\nq1\td6\t-2\nq2\td7\t0\n")
    qrels = load_qrels(tiny_beir_dir / "qrels" / "test.tsv")
    assert qrels["q1"] == {"d1": 1, "d5": 2, "d6": -2} and qrels["q2"]["d7"] == 0
    assert all(type(g) is int for rel in qrels.values() for g in rel.values())


# -- 4. negative grades and pytrec_eval --------------------------------------------------------------------


NEG_CASES = [  # the audit's p7_pytrec_neg cases: each one crashed pytrec_eval (SIGSEGV) or risked it
    ({"q": {"d1": -2}}, {"q": {"d1": 1.0, "d2": 0.5}}),
    ({"q": {"d1": 1, "d2": -2}}, {"q": {"d1": 1.0, "d2": 0.5}}),
    ({"q": {"d9": -5}}, {"q": {"d1": 1.0}}),
    ({"q": {"d1": 1}, "r": {"d1": -2, "d2": -3}}, {"q": {"d1": 1.0}, "r": {"d1": 1.0, "d2": 0.2}}),
    ({"q": {"d1": 2, "d2": -1, "d3": 1}, "r": {"d1": -1, "d3": 1}},
     {"q": {"d1": 0.1, "d2": 0.9, "d3": 0.5}, "r": {"d1": 0.9, "d2": 0.5, "d3": 0.3}}),
]
NEG_METRICS = ["ndcg@10", "recall@100", "mrr@10", "map@10", "precision@5", "f1@5", "accuracy@5"]


def test_negative_grades_do_not_crash_and_score_like_zero():
    """In a subprocess, so a segfault fails this test instead of killing pytest."""
    code = ("import json, sys\nfrom medadapt.eval.metrics import evaluate_run\n"
            "cases, metrics = json.loads(sys.argv[1])\n"
            "print(json.dumps([evaluate_run(q, r, metrics) for q, r in cases]))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([NEG_CASES, NEG_METRICS])],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    got = json.loads(proc.stdout)
    for (qrels, run), res in zip(NEG_CASES, got):
        zeroed = {q: {d: max(g, 0) for d, g in rel.items()} for q, rel in qrels.items()}
        assert res == pytest.approx(evaluate_run(zeroed, run, NEG_METRICS))
    assert got[1]["ndcg@10"] == pytest.approx(1.0) and got[0]["recall@100"] == 0.0


def test_evaluate_run_refuses_huge_grades():
    with pytest.raises(DataError, match=r"qrels grade 2147483647 \(query 'q', document 'd1'\) is above 1000"):
        evaluate_run({"q": {"d1": 2**31 - 1}}, {"q": {"d1": 1.0}}, ["ndcg@10"])


# -- 5. STS scores ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("score", ["NaN", "Infinity", "-Infinity", "1" + "0" * 400])
def test_non_finite_sts_gold_score_names_file_and_line(tmp_path, score):
    sts = _jsonl(tmp_path / "sts.jsonl", [{"sentence1": "a", "sentence2": "b", "score": 1},
                                          '{"sentence1": "c", "sentence2": "d", "score": %s}' % score])
    with pytest.raises(DataError, match=r"sts.jsonl:2: field 'score' must be a finite number"):
        load_sts(sts)


class _StsStub:
    """encode -> fixed vectors; similarity_pairwise -> row-wise dot product."""

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors = vectors

    def encode(self, texts, **_):
        import torch

        return torch.tensor([self.vectors[t] for t in texts])

    def similarity_pairwise(self, a, b):
        return (a * b).sum(-1)


def test_evaluate_sts_never_returns_non_finite_correlations():
    vec = {"a": [1.0, 0.0], "b": [1.0, 0.0], "c": [0.0, 1.0], "d": [1.0, 0.0], "e": [0.5, 0.5],
           "f": [0.6, 0.0]}
    good = [StsPair("a", "b", 5.0), StsPair("c", "d", 0.0), StsPair("e", "f", 2.5)]
    res = evaluate_sts(_StsStub(vec), good)
    assert all(math.isfinite(v) for v in res.values()) and res["spearman"] == pytest.approx(1.0)
    with pytest.raises(MedAdaptError, match="gold scores must be finite"):
        evaluate_sts(_StsStub(vec), [*good[:2], StsPair("e", "f", float("nan"))])
    with pytest.raises(MedAdaptError, match="non-finite similarities"):
        evaluate_sts(_StsStub({**vec, "f": [float("nan"), 0.0]}), good)


# -- 6. ids that would forge TREC run lines ------------------------------------------------------------------


BAD_IDS = ["bad id", "x\nq9 Q0 forged 1 99.0 medadapt", "tab\tid", "nul\x00", "bell\x07", "line\u2028sep",
           "nbsp\u00a0id", ""]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_ids_with_whitespace_or_control_characters_are_refused(tiny_beir_dir, bad):
    _append(tiny_beir_dir / "corpus.jsonl", json.dumps({"_id": bad, "text": "gout toe"}) + "\n")
    what = "empty document id" if not bad else f"document id {re.escape(repr(bad))} contains whitespace"
    with pytest.raises(DataError, match=rf"corpus.jsonl:{N_DOCS + 1}: {what}"):
        load_corpus(tiny_beir_dir / "corpus.jsonl")
    _append(tiny_beir_dir / "queries.jsonl", json.dumps({"_id": bad, "text": "gout"}) + "\n")
    with pytest.raises(DataError, match=rf"queries.jsonl:{N_QUERIES + 1}: .*query id"):
        load_queries(tiny_beir_dir / "queries.jsonl")


def test_qrels_and_tsv_query_ids_with_spaces_are_refused(tiny_beir_dir, tmp_path):
    qrels = tiny_beir_dir / "qrels" / "test.tsv"
    _append(qrels, "q1\tbad id\t1\n")
    line = N_TEST_QRELS + 2
    with pytest.raises(DataError, match=rf"test.tsv:{line}: document id 'bad id' contains whitespace"):
        load_qrels(qrels)
    tsv = tmp_path / "q.tsv"
    tsv.write_text("q 1\tgout toe\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"q.tsv:1: query id 'q 1' contains whitespace"):
        read_queries(tsv)


def test_ordinary_ids_are_accepted(tiny_beir_dir):
    ok = ["PMC-123_a.b", "糖尿病:1", "a/b#c", 42]
    _append(tiny_beir_dir / "corpus.jsonl", "".join(json.dumps({"_id": i, "text": "t"}) + "\n" for i in ok))
    assert set(map(str, ok)) <= set(load_corpus(tiny_beir_dir / "corpus.jsonl"))


def test_packaged_and_shared_datasets_still_load():
    roots = ["medmini"] + [p for p in ("/work/shared/data/medquad", "/work/shared/data/zh-med-qa")
                           if Path(p, "corpus.jsonl").is_file()]
    for root in roots:
        data = load_beir(root)
        assert data.corpus and data.queries and data.qrels
    assert len(load_sts(Path(load_beir("medmini", "test").root) / "sts.jsonl")) >= 2


# -- 7. metric cutoffs -------------------------------------------------------------------------------------


def test_metric_cutoff_has_an_upper_bound():
    assert parse_metric("ndcg@1000000") == ("ndcg", 1_000_000)
    for bad in ("ndcg@1000001", "ndcg@99999999999999999999"):
        with pytest.raises(ValueError, match=r"K must be at most 1,000,000"):
            parse_metric(bad)
        with pytest.raises(ValueError, match="at most"):  # not a KeyError from pytrec_eval
            evaluate_run({"q": {"d": 1}}, {"q": {"d": 1.0}}, [bad])
    with pytest.raises(ConfigError, match="at most"):
        load_recipe(RECIPES / "med-moe-embed-tiny.yaml", ["eval.metrics=[ndcg@99999999999999999999]"])


# -- through the CLI: exit 1, one `error:` line, no traceback, nothing written ----------------------------


def _assert_one_error(proc: subprocess.CompletedProcess, message: str, args) -> None:
    assert proc.returncode == 1, (args, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr + proc.stdout, (args, proc.stderr[-2000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), (args, proc.stderr)
    assert re.search(message, lines[0]), (args, message, lines[0])


def test_cli_bad_data_gives_one_clear_line_and_writes_nothing(tiny_bert_dir, tiny_beir_dir, tmp_path):
    """The first case in a real ``python -m medadapt`` process, the others through the same entry point in this
    one (:func:`conftest.run_cli_cases`)."""
    from conftest import build_tiny_beir, run_cli, run_cli_cases

    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}

    def beir(name: str, file: str, data: bytes) -> Path:
        root = build_tiny_beir(tmp_path / name)
        _append(root / file, data)
        return root

    idx = tmp_path / "lex"
    proc = run_cli(["index", "--corpus", str(tiny_beir_dir), "--out", str(idx), "--kind", "lexical", "-q"], env)
    assert proc.returncode == 0 and idx.is_dir(), proc.stderr[-2000:]  # the good data works
    dup_tsv = tmp_path / "dup.tsv"
    dup_tsv.write_text("a\tasthma\nb\tgout\na\teczema\n", encoding="utf-8")
    bad_tsv = tmp_path / "bad.tsv"
    bad_tsv.write_bytes(b"a\tasthma\nb\tgout \xff\n")
    sts = tmp_path / "sts.jsonl"
    sts.write_text('{"sentence1": "a", "sentence2": "b", "score": 1}\n'
                   '{"sentence1": "c", "sentence2": "d", "score": NaN}\n', encoding="utf-8")
    recipe = tmp_path / "bad.yaml"
    raw = (RECIPES / "med-moe-embed-tiny.yaml").read_bytes()
    recipe.write_bytes(raw.replace(b"description: Med", b"description: M\xe9\xff d", 1))
    bad_utf8 = beir("u", "corpus.jsonl", BAD_UTF8)
    model = ["--model", str(tiny_bert_dir)]
    cases = [  # (args, error pattern, output path that must not appear)
        (["eval", *model, "--data", str(bad_utf8), "--output", str(tmp_path / "o1.json")],
         rf"corpus.jsonl:{N_DOCS + 1}: not valid UTF-8", "o1.json"),
        (["index", "--corpus", str(bad_utf8), "--out", str(tmp_path / "i1"), "--kind", "lexical"],
         rf"corpus.jsonl:{N_DOCS + 1}: not valid UTF-8", "i1"),
        (["eval", *model, "--data", str(beir("d", "queries.jsonl", b'{"_id": "q3", "text": "x"}\n')),
          "--output", str(tmp_path / "o2.json")], rf"queries.jsonl:{N_QUERIES + 1}: duplicate query id 'q3'",
         "o2.json"),
        (["search", "--index", str(idx), "--queries", str(dup_tsv), "--output", str(tmp_path / "r1.trec")],
         r"dup.tsv:3: duplicate query id 'a'", "r1.trec"),
        (["search", "--index", str(idx), "--queries", str(bad_tsv), "--output", str(tmp_path / "r2.trec")],
         r"bad.tsv:2: not valid UTF-8", "r2.trec"),
        (["eval", *model, "--data", str(beir("inf", "qrels/test.tsv", b"q1\td5\tinf\n")),
          "--output", str(tmp_path / "o3.json")], rf"test.tsv:{N_TEST_QRELS + 2}: relevance score 'inf'",
         "o3.json"),
        (["index", "--corpus", str(beir("id", "corpus.jsonl", b'{"_id": "bad id", "text": "t"}\n')),
          "--out", str(tmp_path / "i2"), "--kind", "lexical"], r"document id 'bad id' contains whitespace",
         "i2"),
        (["eval", *model, "--task", "sts", "--data", str(sts), "--output", str(tmp_path / "o4.json")],
         r"sts.jsonl:2: field 'score' must be a finite number", "o4.json"),
        (["eval", *model, "--data", str(tiny_beir_dir), "--metrics", "ndcg@99999999999999999999",
          "--output", str(tmp_path / "o5.json")], r"K must be at most", "o5.json"),
        (["train", str(recipe), "--output", str(tmp_path / "run")], r"bad.yaml:\d+: not valid UTF-8", "run"),
    ]
    for (args, message, out), proc in zip(cases, run_cli_cases([[*a, "-q"] for a, _, _ in cases], env)):
        _assert_one_error(proc, message, args)
        assert not (tmp_path / out).exists(), args
