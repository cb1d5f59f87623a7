"""medadapt.data.text: the one text-input policy (lone surrogates refused, every JSON problem one DataError
naming the place)."""

from __future__ import annotations

import json
import re

import pytest

from medadapt.data import check_text, decode_json
from medadapt.data import text as text_module
from medadapt.errors import DataError

# -- check_text ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value, code, position", [
    ("\ud800", "D800", 1),  # a high surrogate alone (JSON "\ud800")
    ("abc\udfff", "DFFF", 4),  # a low surrogate alone
    ("gout \udcff toe", "DCFF", 6),  # what Python makes of the byte 0xff in a command-line argument
    ("\ude00\ud83d", "DE00", 1),  # a pair in the wrong order is two lone surrogates
])
def test_check_text_refuses_lone_surrogates(value, code, position):
    with pytest.raises(DataError, match=rf"^the query holds a lone surrogate \(U\+{code} at character {position}\)"):
        check_text(value, "the query")


@pytest.mark.parametrize("value", ["", "gout", "糖尿病", "x\U0001F600", "nul\x00", "\ufeffbom", "a\\ud800"])
def test_check_text_accepts_valid_unicode(value):
    assert check_text(value, "x") is value
    value.encode("utf-8")  # what check_text promises: it encodes


# -- decode_json: one DataError naming file and line per input class ----------------------------------------


DEEP = "[" * 100_000 + "]" * 100_000
CASES = [  # (line, message part)
    ('{"text": "x\\ud800y"}', r"field 'text' holds a lone surrogate \(U\+D800 at character 2\)"),
    ('{"_id": "\\uDFFF"}', r"field '_id' holds a lone surrogate \(U\+DFFF"),
    ('{"m": {"\\ud800": 1}}', r"a key of 'm' holds a lone surrogate"),
    ('{"\\ud800": 1}', r"a key holds a lone surrogate"),
    ('{"c": [{"text": "ok"}, {"text": "\\udc80"}]}', r"field 'c\[1\]\.text' holds a lone surrogate"),
    ('"\\ud800"', r"the value holds a lone surrogate"),
    ('{"text": "x\ud800"}', r"field 'text' holds a lone surrogate"),  # a raw surrogate in the string given
    (DEEP, r"invalid JSON \(nested too deeply\)"),
    ('{"a": ' + DEEP + "}", r"invalid JSON \(nested too deeply\)"),
    ('{"_id": ' + "9" * 5000 + "}", r"invalid JSON \(an integer of 5,000 digits; at most 4,300 are accepted\)"),
    ('{"_id": -' + "9" * 4301 + "}", r"invalid JSON \(an integer of 4,301 digits"),
    ('{"text": "a", "text": "b"}', r"invalid JSON \(duplicate key 'text' in one object\)"),
    ('{"m": {"k": 1, "k": 1}}', r"invalid JSON \(duplicate key 'k' in one object\)"),
    ('{"_id": "a", text}', r"invalid JSON \(Expecting property name enclosed in double quotes at column 14\)"),
    ('{"_id": "a"} x', r"invalid JSON \(Extra data at column 14\)"),
    ("", r"invalid JSON \(Expecting value at column 1\)"),
    ('{"text": "a\x00b"}', r"invalid JSON \(Invalid control character"),  # a raw NUL inside a string
    ('\ufeff{"_id": "a"}', r"invalid JSON \(the line starts with a byte-order mark"),
]


@pytest.mark.parametrize("line, message", CASES, ids=lambda v: v[:30] if isinstance(v, str) else None)
def test_decode_json_gives_one_data_error_with_place(line, message):
    with pytest.raises(DataError, match=rf"^data.jsonl:7: {message}"):
        decode_json(line, "data.jsonl", 7)


def test_decode_json_accepts_what_is_valid():
    pairs = '{"text": "x\\ud83d\\ude00", "escaped": "a\\\\ud800", "big": ' + "9" * 4300 + ', "f": 1e999}'
    obj = decode_json(pairs, "f", 1)
    assert obj["text"] == "x\U0001F600" and obj["escaped"] == "a\\ud800" and len(str(obj["big"])) == 4300
    assert obj["f"] == float("inf")  # loaders check the fields that must be finite (NaN / Infinity too)
    assert decode_json('{"a": {"b": [1, {"c": null}]}, "d": "\\u0000"}', "f") == {
        "a": {"b": [1, {"c": None}]}, "d": "\x00"}
    assert decode_json("[" * 500 + "]" * 500, "f") == json.loads("[" * 500 + "]" * 500)  # deep but fine


def test_decode_json_without_line_names_the_source():
    with pytest.raises(DataError, match=r"^<stdin>: invalid JSON"):
        decode_json("{", "<stdin>")


def test_interpreter_int_limit_below_ours_is_still_one_error(monkeypatch):
    import sys

    monkeypatch.setattr(text_module, "MAX_INT_DIGITS", 10**6)
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        with pytest.raises(DataError, match=re.escape("f:2: invalid JSON (Exceeds the limit (1000 digits)")):
            decode_json("9" * 2000, "f", 2)
    finally:
        sys.set_int_max_str_digits(old)
