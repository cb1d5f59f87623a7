"""JSON-lines reading with errors that name the file and the line."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from medadapt.data.text import decode_json
from medadapt.errors import DataError


#: largest relevance grade accepted in qrels / rerank files (trec_eval allocates memory per grade level and
#: silently scores 0, or crashes, on huge grades); :mod:`medadapt.eval.metrics` enforces it too
MAX_GRADE = 1000

#: longest line (in characters, without its newline) a data file may hold: a file with no newlines (a binary
#: file given by mistake) is refused after this much, not read whole into memory
MAX_LINE_CHARS = 1 << 28


def require_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: {path}")
    return path


def iter_lines(path: str | Path, what: str = "file") -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, line)`` of a UTF-8 text file (a leading BOM dropped); bytes that are not UTF-8
    or a line over :data:`MAX_LINE_CHARS` are a :class:`DataError` naming the file and the line."""
    path = require_file(path, what)
    limit = MAX_LINE_CHARS
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        lineno = 0
        while line := f.readline(limit + 1):
            lineno += 1
            if len(line) > limit and not line.endswith("\n"):
                raise DataError(f"{path}:{lineno}: line longer than {limit:,} characters")
            if not line.isascii():
                check_utf8(line, path, lineno)
            yield lineno, line


_UNDECODED = re.compile("[\udc80-\udcff]")  # what errors="surrogateescape" turns invalid bytes into


def check_utf8(line: str, path: Path | str, lineno: int) -> None:
    """Raise :class:`DataError` if ``line`` (read with ``errors="surrogateescape"``) held bytes that are
    not UTF-8."""
    bad = _UNDECODED.search(line)
    if bad is not None:
        col = len(line[: bad.start()].encode("utf-8", "surrogateescape")) + 1
        byte = line[bad.start()].encode("utf-8", "surrogateescape")
        raise DataError(f"{path}:{lineno}: not valid UTF-8 (byte {col} of the line is {byte!r}); "
                        "save the file as UTF-8")


_BAD_ID_CHAR = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")  # whitespace (Unicode) and control characters (Cc)


def has_bad_id_chars(value: str) -> bool:
    """True for an empty id or one holding whitespace or control characters (see :func:`check_id`)."""
    return not value or _BAD_ID_CHAR.search(value) is not None


def check_id(value: str, what: str, path: Path | str, lineno: int) -> str:
    """Refuse an empty id or one holding whitespace or control characters: ids are written into
    whitespace-separated TREC run and qrels files, where such an id would split or forge lines."""
    if not value:
        raise DataError(f"{path}:{lineno}: empty {what}")
    if any(c.isspace() or unicodedata.category(c) == "Cc" for c in value):
        raise DataError(f"{path}:{lineno}: {what} {value!r} contains whitespace or control characters")
    return value


def iter_jsonl(path: str | Path, what: str = "JSONL file") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; whatever :func:`~medadapt.data.text.decode_json`
    refuses is a :class:`DataError` naming the file and the line."""
    path = require_file(path, what)
    for lineno, line in iter_lines(path, what):
        if not line.strip():
            continue
        obj = decode_json(line.rstrip("\n"), path, lineno)
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def field(obj: dict, key: str, kind: type | tuple[type, ...], path: Path | str, lineno: int, required: bool = True):
    """Fetch ``obj[key]`` checking its type; errors name file, line and field."""
    if key not in obj or obj[key] is None:
        if required:
            raise DataError(f"{path}:{lineno}: missing field {key!r}")
        return None
    value = obj[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind in (int, float, (int, float)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise DataError(f"{path}:{lineno}: field {key!r} must be {names}, got {type(value).__name__}")
    return value
