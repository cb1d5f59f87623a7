"""medadapt.data.jsonl and every JSONL loader built on it: each hostile input class is one DataError naming
the file and the line (lone surrogates, deep nesting, huge integers, duplicate keys, non-objects, a BOM
inside the file, over-long lines, empty queries), and the harmless oddities (a BOM at the start, CRLF or
CR line ends, U+2028 inside a string, blank lines) load correctly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from medadapt.bmretriever.pretrain_data import CorpusSource, iter_corpus
from medadapt.data import jsonl as jsonl_module
from medadapt.data import load_corpus, load_queries, load_rerank, load_sts, load_training_groups
from medadapt.data.jsonl import iter_jsonl, iter_lines
from medadapt.data.sources import query_sources
from medadapt.errors import DataError

# name -> (loader of a file, a valid line, templates of a line whose "{S}" is inside the named string field)
LOADERS = {
    "corpus": (load_corpus, '{"_id": "a", "title": "t", "text": "gout toe"}',
               {"text": '{"_id": "z", "text": "x{S}"}', "title": '{"_id": "z", "title": "{S}", "text": "x"}',
                "_id": '{"_id": "z{S}", "text": "x"}'}),
    "queries": (load_queries, '{"_id": "q", "text": "gout"}',
                {"text": '{"_id": "z", "text": "{S}x"}', "_id": '{"_id": "{S}", "text": "x"}'}),
    "sts": (load_sts, '{"sentence1": "a", "sentence2": "b", "score": 1}',
            {"sentence2": '{"sentence1": "a", "sentence2": "b{S}", "score": 2}'}),
    "rerank": (load_rerank, '{"query": "gout", "candidates": [{"text": "toe", "grade": 1}]}',
               {"query": '{"query": "x{S}", "candidates": [{"text": "toe"}]}',
                "candidates[1].text": '{"query": "x", "candidates": [{"text": "a"}, {"text": "{S}"}]}'}),
    "training": (load_training_groups, '{"query": "gout", "pos": ["toe"], "neg": ["flu"]}',
                 {"query": '{"query": "{S}", "pos": ["toe"]}', "neg[0]": '{"query": "q", "pos": ["a"], "neg": ["{S}"]}',
                  "prompt": '{"query": "q", "pos": ["a"], "prompt": "{S}"}'}),
    "sources": (lambda p: query_sources(p.parent), '{"_id": "q", "text": "gout", "metadata": {"source": "nih"}}',
                {"metadata.source": '{"_id": "z", "text": "x", "metadata": {"source": "{S}"}}'}),
    "stage-I": (lambda p: list(iter_corpus(CorpusSource(path=p))), '{"_id": "a", "text": "gout toe"}',
                {"text": '{"_id": "z", "text": "{S}"}'}),
}
FILE_NAME = {"sources": "queries.jsonl"}


def _write(tmp_path: Path, loader: str, lines: list[str], raw: bytes | None = None) -> Path:
    path = tmp_path / FILE_NAME.get(loader, f"{loader}.jsonl")
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _load(loader: str, path: Path):
    return LOADERS[loader][0](path)


SURROGATE_CASES = [(name, fld, tpl) for name, (_, _, tpls) in LOADERS.items() for fld, tpl in tpls.items()]


@pytest.mark.parametrize("loader, fld, template", SURROGATE_CASES, ids=[f"{n}-{f}" for n, f, _ in SURROGATE_CASES])
@pytest.mark.parametrize("escape", ["\\ud800", "\\uDFFF", "\\udc80"])
def test_lone_surrogate_escape_is_refused_at_load_with_file_and_line(tmp_path, loader, fld, template, escape):
    path = _write(tmp_path, loader, [LOADERS[loader][1], "", template.replace("{S}", escape)])
    code = escape[2:].upper()
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:3: field {re.escape(repr(fld))} holds a lone "
                                        rf"surrogate \(U\+{code} at character \d+\)"):
        _load(loader, path)


DEEP = "[" * 100_000 + "]" * 100_000
BAD_LINES = {  # input class -> (line 2 of the file, message after "<file>:2: ")
    "deep-array": (DEEP, r"invalid JSON \(nested too deeply\)"),
    "deep-in-object": ('{"_id": "z", "text": "x", "m": ' + "{\"a\": " * 50_000 + "1" + "}" * 50_001,
                       r"invalid JSON \(nested too deeply\)"),
    "5000-digit-id": ('{"_id": ' + "7" * 5000 + ', "text": "x"}', r"invalid JSON \(an integer of 5,000 digits"),
    "5000-digit-score": ('{"score": ' + "7" * 5000 + "}", r"invalid JSON \(an integer of 5,000 digits"),
    "duplicate-key": ('{"_id": "z", "text": "x", "text": "y"}', r"invalid JSON \(duplicate key 'text' in one object\)"),
    "nested-duplicate-key": ('{"m": {"a": 1, "a": 2}}', r"invalid JSON \(duplicate key 'a' in one object\)"),
    "array-line": ("[1, 2]", r"expected a JSON object, got list"),
    "string-line": ('"text"', r"expected a JSON object, got str"),
    "null-line": ("null", r"expected a JSON object, got NoneType"),
    "invalid": ('{"_id": "z", text}', r"invalid JSON \(Expecting property name"),
    "truncated": ('{"_id": "z", "te', r"invalid JSON \(Unterminated string"),
    "raw-nul": ('{"_id": "z",\x00 "text": "x"}', r"invalid JSON \(Expecting property name"),
    "bom-inside-file": ('\ufeff{"_id": "z", "text": "x"}', r"invalid JSON \(the line starts with a byte-order mark"),
}


@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_json_line_is_one_data_error_with_file_and_line(tmp_path, loader, case):
    line, message = BAD_LINES[case]
    path = _write(tmp_path, loader, [LOADERS[loader][1], line, LOADERS[loader][1]])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: {message}"):
        _load(loader, path)


@pytest.mark.parametrize("loader", list(LOADERS))
def test_bom_crlf_cr_and_blank_lines_load(tmp_path, loader):
    good = LOADERS[loader][1]
    other = good.replace('"a"', '"b"').replace('"q"', '"r"')
    (tmp_path / "plain").mkdir()
    reference = _load(loader, _write(tmp_path / "plain", loader, [good, other]))
    for n, ending in enumerate((b"\r\n", b"\r", b"\n")):
        raw = b"\xef\xbb\xbf" + good.encode() + ending + b"  " + ending + other.encode() + ending
        (tmp_path / str(n)).mkdir()
        assert _load(loader, _write(tmp_path / str(n), loader, [], raw)) == reference, ending


def test_line_numbers_count_blank_lines_and_crlf(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"_id": "a", "text": "x"}\r\n\r\n   \r\n{"_id": "b", "text": "y"}\r\n{"_id": "c"}\r\n')
    with pytest.raises(DataError, match=r"c.jsonl:5: missing field 'text'"):
        load_corpus(path)
    assert [n for n, _ in iter_jsonl(path)][:2] == [1, 4]


def test_line_separators_inside_strings_do_not_split_records(tmp_path):
    text = "before\u2028after\u0085next\x0bvt\x0cff"  # str.splitlines would split at each of these
    path = tmp_path / "corpus.jsonl"
    path.write_text(json.dumps({"_id": "a", "text": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert load_corpus(path) == {"a": {"title": "", "text": text}}


def test_escaped_nul_and_surrogate_pairs_are_text(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"_id": "a", "text": "x\\u0000y \\ud83d\\ude00"}\n{"_id": "b", "text": "\\\\ud800"}\n',
                    encoding="utf-8")
    assert load_corpus(path) == {"a": {"title": "", "text": "x\x00y \U0001F600"}, "b": {"title": "", "text": "\\ud800"}}
    path.write_text('{"_id": "a\\u0000", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"corpus.jsonl:1: document id 'a\\x00' contains whitespace or control"):
        load_corpus(path)


@pytest.mark.parametrize("loader, line, message", [
    ("queries", '{"_id": "z", "text": "  \\t "}', r"query 'z' has an empty text"),
    ("queries", '{"_id": "z", "text": ""}', r"query 'z' has an empty text"),
    ("rerank", '{"query": " ", "candidates": [{"text": "a"}]}', r"'query' is empty"),
    ("training", '{"query": "\\n", "pos": ["a"]}', r"field 'query' is empty"),
])
def test_empty_query_is_refused_with_file_and_line(tmp_path, loader, line, message):
    path = _write(tmp_path, loader, [LOADERS[loader][1], line])
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}:2: {message}"):
        _load(loader, path)


# -- over-long lines: a limit, so a file without newlines is not read whole (the limit made small here) -------


def test_over_long_line_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl_module, "MAX_LINE_CHARS", 64)
    path = tmp_path / "corpus.jsonl"
    at_limit = '{"_id": "a", "text": "' + "x" * (64 - 24) + '"}'
    assert len(at_limit) == 64
    path.write_text(at_limit + "\n" + '{"_id": "b", "text": "' + "y" * 100 + '"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"^.*corpus.jsonl:2: line longer than 64 characters$"):
        load_corpus(path)
    path.write_bytes(b"\x00" * 1000)  # no newline at all (a binary file given by mistake)
    with pytest.raises(DataError, match=r"corpus.jsonl:1: line longer than 64 characters"):
        load_corpus(path)
    path.write_text(at_limit, encoding="utf-8")  # at the limit, without a final newline: fine
    assert load_corpus(path)["a"]["text"] == "x" * 40
    qrels = tmp_path / "q.tsv"
    qrels.write_text("q\td\t1\n" + "q\t" + "d" * 100 + "\t1\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"q.tsv:2: line longer than 64 characters"):
        list(iter_lines(qrels))


def test_default_line_limit_is_generous():
    assert jsonl_module.MAX_LINE_CHARS >= 100 * 2**20  # a 100 MB document still loads


# -- the other text readers that follow the same policy -------------------------------------------------------


@pytest.mark.parametrize("raw, message", [
    (b'{"gout": ["podagra"],\n "x": "\\ud800"}', r"syn.json: field 'x' holds a lone surrogate"),
    (b'{"gout": ["podagra"],\n "gout": ["x"]}', r"syn.json: invalid JSON \(duplicate key 'gout' in one object\)"),
    (b'{"gout": ["podagra"],\n "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", r"syn.json: invalid JSON \(nested"),
    (b'{"gout": ["podagra"],\n "a" 1}', r"syn.json: invalid JSON \(Expecting ':' delimiter at line 2 column 6\)"),
    (b'{"gout": ["podagra"],\n "a\xff": []}', r"syn.json:2: not valid UTF-8"),
])
def test_synonym_dictionary_follows_the_policy(tmp_path, raw, message):
    from medadapt.curation.sts_triplets import load_synonyms

    path = tmp_path / "syn.json"
    path.write_bytes(raw)
    with pytest.raises(DataError, match=message):
        load_synonyms(path)


def test_sentences_file_names_the_line_of_bad_bytes(tmp_path):
    from medadapt.cli._data_run import _load_sentences

    path = tmp_path / "s.txt"
    path.write_bytes(b"gout is painful\n\nasthma \xff wheeze\n")
    with pytest.raises(DataError, match=r"s.txt:3: not valid UTF-8"):
        _load_sentences(path)
    path.write_bytes(b"gout is painful\r\n\r\nasthma wheeze\r\n")
    assert _load_sentences(path) == ["gout is painful", "asthma wheeze"]


@pytest.mark.parametrize("raw, message", [
    ('{"q1": {"d1": 1.0}, "q1": {"d2": 2.0}}', r"run.json: invalid JSON \(duplicate key 'q1' in one object\)"),
    ('{"q1": ' + "[" * 100_000 + "]" * 100_000 + "}", r"run.json: invalid JSON \(nested too deeply\)"),
    ('{"q\\ud800": {"d1": 1.0}}', r"run.json: a key holds a lone surrogate"),
    ('{"q1": {"d1": 1.0},\n "q2" {}}', r"run.json: invalid JSON \(Expecting ':' delimiter at line 2 column 7\)"),
])
def test_json_run_file_follows_the_policy(tmp_path, raw, message):
    from medadapt.eval.compare import read_run

    path = tmp_path / "run.json"
    path.write_text(raw, encoding="utf-8")
    with pytest.raises(DataError, match=message):
        read_run(path)
