"""medadapt.data.beir / builtin / sources: conflicting qrels grades, split names that would leave the data
folder, unknown data names (the error lists the builtin sets), empty query texts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from medadapt.data import builtin_names, check_split, data_folder, load_beir, load_qrels
from medadapt.data.sources import leave_one_source_out, query_sources
from medadapt.errors import DataError
from medadapt.eval.suites import get_suite, load_suite
from medadapt.retrieval.corpus import load_documents

N_TEST_QRELS = 13  # judgements in the tiny set's qrels/test.tsv, after its header line
BUILTINS = "medmini, medquad-mini, tiny-beir"


def _append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


# -- qrels: a pair judged twice ------------------------------------------------------------------------------


def test_conflicting_duplicate_grade_is_refused_with_both_lines(tiny_beir_dir):
    qrels = tiny_beir_dir / "qrels" / "test.tsv"
    first = next(n for n, line in enumerate(qrels.read_text().splitlines(), 1) if line.startswith("q1\t"))
    q1_doc = qrels.read_text().splitlines()[first - 1].split("\t")[1]
    _append(qrels, f"q1\t{q1_doc}\t1\nq1\t{q1_doc}\t2\n")  # an identical repeat, then another grade
    with pytest.raises(DataError, match=rf"test.tsv:{N_TEST_QRELS + 3}: query 'q1' document '{q1_doc}' is graded 2 "
                                        rf"here and 1 on line {first}$"):
        load_qrels(qrels)
    with pytest.raises(DataError, match=rf"test.tsv:{N_TEST_QRELS + 3}: query 'q1'"):
        load_beir(tiny_beir_dir, "test")


def test_identical_duplicate_judgement_is_kept_once(tiny_beir_dir):
    qrels = tiny_beir_dir / "qrels" / "test.tsv"
    before = load_qrels(qrels)
    _append(qrels, "".join(f"{q}\t{d}\t{g}.0\n" for q, rel in before.items() for d, g in rel.items()))
    assert load_qrels(qrels) == before


# -- split names ---------------------------------------------------------------------------------------------


BAD_SPLITS = ["../../etc/passwd", "/etc/passwd", "../test", "qrels/test", "a\\b", "..", ".", ".hidden", "",
              "test ", "te st", "test\x00", "test\n", "-rf", "_x", "x" * 101, "~/x"]


@pytest.mark.parametrize("split", BAD_SPLITS)
def test_split_that_is_not_a_plain_name_is_refused_before_reading(tiny_beir_dir, split):
    message = rf"^split {re.escape(repr(split if len(split) <= 100 else split[:100]))}(\.\.\.)? is not a split name: " \
              r"use a plain name such as 'test' or 'dev' \(letters, digits"
    with pytest.raises(DataError, match=message):
        check_split(split)
    with pytest.raises(DataError, match=message):
        load_beir(tiny_beir_dir, split)
    with pytest.raises(DataError, match=message):
        load_beir(tiny_beir_dir, ["test", split])
    with pytest.raises(DataError, match=message):  # checked before the data name
        load_beir(tiny_beir_dir / "nowhere", [split])


def test_split_outside_the_folder_is_refused_even_when_the_file_exists(tiny_beir_dir, tmp_path):
    outside = tmp_path / "stolen.tsv"
    outside.write_text((tiny_beir_dir / "qrels" / "test.tsv").read_text())
    for split in ("../../stolen", str(tmp_path / "stolen")):
        assert (tiny_beir_dir / "qrels" / f"{split}.tsv").resolve() == outside.resolve()
        with pytest.raises(DataError, match="is not a split name"):
            load_beir(tiny_beir_dir, split)


@pytest.mark.parametrize("split", ["test", "dev", "train", "test-in", "test-out", "all", "v1.2", "split_2", "测试"])
def test_plain_split_names_pass(split):
    assert check_split(split) == split


def test_suite_loader_checks_the_split(tmp_path):
    with pytest.raises(DataError, match=r"split '\.\./\.\./etc/passwd' is not a split name"):
        load_suite(get_suite("cure"), tmp_path, split="../../etc/passwd")


# -- unknown data names ---------------------------------------------------------------------------------------


def test_builtin_names_are_the_documented_sets():
    assert ", ".join(builtin_names()) == BUILTINS


@pytest.mark.parametrize("call", [
    lambda name: load_beir(name),
    lambda name: load_beir(name, "test"),
    lambda name: data_folder(name),
    lambda name: query_sources(name),
])
def test_unknown_data_name_lists_the_builtin_sets(call):
    with pytest.raises(DataError, match=rf"^data folder not found: medmin is neither a folder nor a builtin "
                                        rf"dataset \({re.escape(BUILTINS)}\)$"):
        call("medmin")


def test_unknown_data_name_in_other_loaders(tmp_path):
    with pytest.raises(DataError, match=rf"data folder not found: medmin is neither .*\({re.escape(BUILTINS)}\)"):
        leave_one_source_out("medmin", "nih", tmp_path / "fold")
    assert not (tmp_path / "fold").exists()
    with pytest.raises(DataError, match=rf"corpus not found: medmin \(.*builtin dataset: {re.escape(BUILTINS)}\)"):
        load_documents("medmin")


def test_a_file_is_not_a_data_folder(tiny_beir_dir):
    with pytest.raises(DataError, match=r"corpus.jsonl is neither a folder nor a builtin dataset"):
        load_beir(tiny_beir_dir / "corpus.jsonl")


# -- empty queries ----------------------------------------------------------------------------------------------


def test_empty_query_text_in_queries_file_is_refused(tiny_beir_dir):
    lines = (tiny_beir_dir / "queries.jsonl").read_text().splitlines()
    _append(tiny_beir_dir / "queries.jsonl", '{"_id": "blank", "text": " \\t"}\n')
    with pytest.raises(DataError, match=rf"queries.jsonl:{len(lines) + 1}: query 'blank' has an empty text"):
        load_beir(tiny_beir_dir, "test")
