"""``medadapt search --queries``: a queries file, or a data set (BEIR folder or builtin name) with ``--split``."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from medadapt.cli import app
from medadapt.data import load_beir
from medadapt.retrieval import Retriever, load_documents

BUILTINS = re.escape("(medmini, medquad-mini, tiny-beir)")


@pytest.fixture()
def lexical_index(tiny_beir_dir, tmp_path):
    """A BM25 index over the tiny BEIR corpus (no model needed)."""
    folder = tmp_path / "bm25.index"
    Retriever.build(load_documents(tiny_beir_dir), kind="lexical", show_progress=False).save(folder)
    return folder


def _search(*args):
    result = CliRunner().invoke(app, ["search", *args, "-q"])
    return result, [ln for ln in result.output.splitlines() if ln.strip()]


def _qids(lines):
    return list(dict.fromkeys(line.split()[0] for line in lines))


def test_queries_of_a_split_of_a_data_set(lexical_index, tiny_beir_dir, tmp_path):
    res, lines = _search("--index", str(lexical_index), "--queries", str(tiny_beir_dir), "--split", "test",
                         "-k", "3")
    assert res.exit_code == 0, res.output
    assert _qids(lines) == list(load_beir(tiny_beir_dir, ["test"]).qrels["test"])  # qrels order, only `test`
    assert all(len(line.split()) == 6 and line.endswith(" medadapt") for line in lines)

    # the same queries from a qid<TAB>text file give the same run
    data = load_beir(tiny_beir_dir, ["test"])
    tsv = tmp_path / "q.tsv"
    tsv.write_text("".join(f"{q}\t{t}\n" for q, t in data.split_queries("test").items()))
    res, from_file = _search("--index", str(lexical_index), "--queries", str(tsv), "-k", "3")
    assert res.exit_code == 0 and from_file == lines


def test_every_query_of_a_data_set_without_split(lexical_index, tiny_beir_dir, tmp_path):
    out = tmp_path / "run.trec"
    res, _ = _search("--index", str(lexical_index), "--queries", str(tiny_beir_dir), "--output", str(out), "-k", "1")
    assert res.exit_code == 0, res.output
    assert _qids(out.read_text().splitlines()) == list(load_beir(tiny_beir_dir, []).queries)  # 24: test + train


def test_builtin_data_set_name(lexical_index):
    res, lines = _search("--index", str(lexical_index), "--queries", "tiny-beir", "--split", "train", "-k", "1")
    assert res.exit_code == 0, res.output
    assert _qids(lines) == [f"t{i}" for i in range(12)]


@pytest.mark.parametrize("args, message", [
    (["--queries", "medmin"], rf"^error: queries not found: medmin is neither a file, a folder nor a builtin "
                              rf"dataset {BUILTINS}$"),
    (["--queries", "{beir}", "--split", "../qrels/test"], r"^error: split '../qrels/test' is not a split name"),
    (["--queries", "{beir}", "--split", "dev"], r"^error: qrels file not found: .*dev.tsv \(available splits: test, "
                                                r"train\)$"),
    (["--queries", "{beir}/queries.jsonl", "--split", "test"], r"^error: --split applies to a data set"),
    (["--split", "test", "gout"], r"^error: --split applies to --queries$"),
])
def test_bad_queries_source_gives_one_error_line(lexical_index, tiny_beir_dir, args, message):
    args = [a.replace("{beir}", str(tiny_beir_dir)) for a in args]
    res, lines = _search("--index", str(lexical_index), *args)
    assert res.exit_code == 1 and len(lines) == 1 and re.search(message, lines[0]), res.output
