"""JSON-lines reading with errors that name the file and the line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from medadapt.errors import DataError


def require_file(path: str | Path, what: str) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{what} not found: {path}")
    return path


def iter_jsonl(path: str | Path, what: str = "JSONL file") -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; raise :class:`DataError` on bad JSON."""
    path = require_file(path, what)
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
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
