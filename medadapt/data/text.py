"""The text-input policy every loader and the CLI apply (docs/guarantees.md): :func:`check_text` refuses lone
surrogates; :func:`decode_json` turns every JSON problem (invalid, too deep, huge integers, duplicate keys,
surrogates) into one :class:`DataError` naming file and line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from medadapt.errors import DataError

#: the longest integer literal accepted in JSON data (Python's own default limit for int <-> str)
MAX_INT_DIGITS = 4300

_SURROGATE = re.compile("[\ud800-\udfff]")
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # what JSON decodes to a surrogate (pairs match too)


def check_text(value: str, where: str) -> str:
    """``value``, unless it holds a lone surrogate (no UTF-8 file can; hashing and tokenising would crash):
    then a :class:`DataError`."""
    bad = _SURROGATE.search(value)
    if bad is not None:
        raise DataError(f"{where} holds a lone surrogate (U+{ord(bad.group()):04X} at character {bad.start() + 1}), "
                        "which is not valid Unicode text (an escape such as \\ud800, or bytes that are not UTF-8)")
    return value


class _Refused(Exception):
    """Raised by the decoder hooks; :func:`decode_json` reports it with the file and the line."""


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"duplicate key {key!r} in one object")
            seen.add(key)
    return obj


def _int(literal: str) -> int:
    digits = len(literal.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise _Refused(f"an integer of {digits:,} digits; at most {MAX_INT_DIGITS:,} are accepted")
    return int(literal)


_DECODER = json.JSONDecoder(object_pairs_hook=_object, parse_int=_int)


def _json_path(parts: tuple) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _check_strings(value: Any, where: str) -> None:
    """Every key and string inside ``value`` through :func:`check_text` (iteratively: no recursion limit)."""
    stack: list[tuple[Any, tuple]] = [(value, ())]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            check_text(item, f"{where}: field {_json_path(at)!r}" if at else f"{where}: the value")
        elif isinstance(item, dict):
            for key, sub in item.items():
                check_text(key, f"{where}: a key of {_json_path(at)!r}" if at else f"{where}: a key")
                stack.append((sub, (*at, key)))
        elif isinstance(item, list):
            stack.extend((sub, (*at, i)) for i, sub in enumerate(item))


def decode_json(text: str, path: str | Path, lineno: int | None = None) -> Any:
    """Decode one JSON document (a JSONL line); every problem is one :class:`DataError` starting
    ``"<path>:<lineno>: "``. ``NaN`` / ``Infinity`` decode as Python's JSON does (loaders check the fields
    that must be finite)."""
    where = f"{path}:{lineno}" if lineno is not None else str(path)
    if text.startswith("\ufeff"):  # a file's own BOM is dropped when it is read; this one is inside the file
        raise DataError(f"{where}: invalid JSON (the line starts with a byte-order mark, U+FEFF; "
                        "were files joined together?)")
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        at = f"column {exc.colno}" if lineno is not None else f"line {exc.lineno} column {exc.colno}"
        raise DataError(f"{where}: invalid JSON ({exc.msg.removesuffix(' at')} at {at})") from None
    except _Refused as exc:
        raise DataError(f"{where}: invalid JSON ({exc})") from None
    except RecursionError:
        raise DataError(f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError as exc:  # e.g. an interpreter with a lower int <-> str limit than MAX_INT_DIGITS
        raise DataError(f"{where}: invalid JSON ({str(exc).split(';')[0]})") from None
    if _ESCAPED_SURROGATE.search(text) is not None or not text.isascii() and _SURROGATE.search(text) is not None:
        _check_strings(value, where)  # an escaped pair (an emoji) matches too: then the walk finds nothing
    return value
