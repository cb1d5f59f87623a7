"""The text-input policy through the CLI (typer's CliRunner): a lone surrogate in a corpus, a query or a
queries file, a --split that leaves the data folder, an unknown data name, conflicting qrels grades and
hostile JSON each give exactly one `error:` line, exit code 1, no traceback, nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from medadapt.cli import app

from conftest import build_tiny_beir

pytestmark = pytest.mark.usefixtures("_isolated_cache")  # each test: its own $MEDADAPT_CACHE

N_DOCS, N_QUERIES, N_TEST_QRELS = 12, 24, 13  # lines of the tiny BEIR set's files (qrels after the header)
BUILTINS = re.escape("(medmini, medquad-mini, tiny-beir)")


def _beir(root: Path, file: str = "", line: str = "") -> Path:
    build_tiny_beir(root)
    if file:
        with open(root / file, "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return root


def _one_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*args, "-q"])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1, (args, result.output)
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), (args, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.output)
    assert re.search(message, lines[0]), (args, message, lines[0])


def test_bad_text_input_gives_one_error_line(tiny_bert_dir, tmp_path):
    model = ["--model", str(tiny_bert_dir)]
    sur_doc = _beir(tmp_path / "sd", "corpus.jsonl", '{"_id": "zz", "text": "gout \\ud800 toe"}')
    sur_qid = _beir(tmp_path / "sq", "queries.jsonl", '{"_id": "q\\udfff", "text": "gout"}')
    deep = _beir(tmp_path / "deep", "corpus.jsonl", "[" * 100_000 + "]" * 100_000)
    bigint = _beir(tmp_path / "big", "corpus.jsonl", '{"_id": ' + "1" * 5000 + ', "text": "x"}')
    dupkey = _beir(tmp_path / "dup", "corpus.jsonl", '{"_id": "zz", "text": "a", "text": "b"}')
    grades = _beir(tmp_path / "gr", "qrels/test.tsv", "q1\td1\t1\nq1\td1\t3")
    good = _beir(tmp_path / "good")
    sts = tmp_path / "sts"
    sts.mkdir()
    (sts / "sts.jsonl").write_text("".join(json.dumps({"sentence1": "a", "sentence2": "b", "score": s}) + "\n"
                                           for s in (1, 2)))
    cases = [  # (args, the error line, a path that must not appear)
        (["eval", *model, "--data", str(sur_doc), "--output", str(tmp_path / "o1.json")],
         rf"^error: .*corpus.jsonl:{N_DOCS + 1}: field 'text' holds a lone surrogate \(U\+D800 at character 6\)",
         "o1.json"),
        (["index", "--corpus", str(sur_doc), "--out", str(tmp_path / "i1"), "--kind", "lexical"],
         rf"corpus.jsonl:{N_DOCS + 1}: field 'text' holds a lone surrogate", "i1"),
        (["eval", *model, "--data", str(sur_qid), "--output", str(tmp_path / "o2.json")],
         rf"queries.jsonl:{N_QUERIES + 1}: field '_id' holds a lone surrogate \(U\+DFFF", "o2.json"),
        (["search", "--index", str(tmp_path / "no-index"), "gout \ud800"],
         r"^error: the query holds a lone surrogate \(U\+D800 at character 6\)", ""),
        (["search", "--index", str(tmp_path / "no-index"), "gout \udcff"],  # the byte 0xff in argv
         r"^error: the query holds a lone surrogate \(U\+DCFF", ""),
        (["search", "--index", str(tmp_path / "no-index"), " \t "], r"^error: the query is empty$", ""),
        (["eval", *model, "--data", str(good), "--query-prompt", "q\ud800: ", "--output", str(tmp_path / "o7.json")],
         r"^error: --query-prompt holds a lone surrogate \(U\+D800 at character 2\)", "o7.json"),
        (["eval", *model, "--data", str(deep), "--output", str(tmp_path / "o3.json")],
         rf"corpus.jsonl:{N_DOCS + 1}: invalid JSON \(nested too deeply\)", "o3.json"),
        (["eval", *model, "--data", str(bigint), "--output", str(tmp_path / "o4.json")],
         rf"corpus.jsonl:{N_DOCS + 1}: invalid JSON \(an integer of 5,000 digits", "o4.json"),
        (["index", "--corpus", str(dupkey), "--out", str(tmp_path / "i2"), "--kind", "lexical"],
         rf"corpus.jsonl:{N_DOCS + 1}: invalid JSON \(duplicate key 'text' in one object\)", "i2"),
        (["eval", *model, "--data", str(grades), "--output", str(tmp_path / "o5.json")],
         rf"test.tsv:{N_TEST_QRELS + 3}: query 'q1' document 'd1' is graded 3 here and 1 on line \d+$", "o5.json"),
    ]
    for args, message, out in cases:
        _one_error(args, message)
        assert not out or not (tmp_path / out).exists(), args
    bad_split = r"^error: split '{}' is not a split name: use a plain name such as 'test' or 'dev'"
    for split in ("../../etc/passwd", "/etc/passwd", "qrels/test"):
        _one_error(["eval", *model, "--data", str(good), "--split", split, "--output", str(tmp_path / "o6.json")],
                   bad_split.format(re.escape(split)))
        _one_error(["eval", *model, "--task", "sts", "--data", str(sts), "--split", split],
                   bad_split.format(re.escape(split)))
        _one_error(["data", "mine", "--data", str(good), "--split", split, "--output", str(tmp_path / "m.jsonl")],
                   bad_split.format(re.escape(split)))
    assert not (tmp_path / "o6.json").exists() and not (tmp_path / "m.jsonl").exists()
    _one_error(["eval", *model, "--data", "medmin"],
               rf"^error: data folder not found: medmin is neither a folder nor a builtin dataset {BUILTINS}$")
    _one_error(["eval", *model, "--task", "sts", "--data", "medmin"],
               rf"^error: data not found: medmin is neither a file, a folder nor a builtin dataset {BUILTINS}$")
    _one_error(["index", "--corpus", "medmin", "--out", str(tmp_path / "i3"), "--kind", "lexical"],
               r"^error: corpus not found: medmin \(expected a BEIR folder, a corpus.jsonl or a builtin dataset: "
               r"medmini, medquad-mini, tiny-beir\)$")
    assert not (tmp_path / "i3").exists()
