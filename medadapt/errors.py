"""Exception types. Every error meant for a user derives from :class:`MedAdaptError`; the CLI prints
its message on one line and exits non-zero, without a traceback."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from urllib.parse import quote

#: Credentials that may sit in text a remote server sends back (an echoed request, a debug page), each with
#: what replaces it: bearer / basic tokens, ``api_key=...`` / ``"token": "..."`` values, OpenAI-style
#: ``sk-...`` keys and passwords in URLs (``https://user:pass@host``).
_CREDENTIALS = [
    # a token, not a word ("Basic authentication", "Bearer token"): a digit or symbol, or a lower-upper change
    (re.compile(r"\b([Bb]earer|BEARER|[Bb]asic|BASIC)(\s+)(?=[\w.~+/=:-]*(?:[0-9.~+/=:-]|[a-z][A-Z]))"
                r"[\w.~+/=:-]+"), r"\1\2***"),
    (re.compile(r"(?i)((?:api[_-]?key|access[_-]?token|auth[_-]?token|secret|password|passwd|token|"
                r"authorization)[\"']?\s*[=:]\s*[\"']?)(?!\*\*\*)(?:bearer\s+|basic\s+)?"
                r"[^\s\"'&,;}<>]+"), r"\1***"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{6,}"), "sk-***"),
    (re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@"), r"\1***@"),
]


def redact(text: str, secrets: Iterable[str | None] = (), limit: int | None = None) -> str:
    """``text`` from a remote server made safe to print: every one of ``secrets`` (the API key, the values of
    the headers sent; also JSON- and URL-escaped) and anything that looks like a credential (see
    ``_CREDENTIALS``) becomes ``***``. ``limit``: cut the result to that many characters, after redacting,
    so a secret is never cut in half and left partly readable. Secrets shorter than 4 characters are
    only caught by the patterns (replacing every ``k`` of a message would garble it)."""
    text = str(text)
    if limit is not None:
        text = text[: limit + 8192]  # a long body: what could reach the first `limit` characters
    forms = set()
    for secret in secrets:
        if secret and len(secret) >= 4:
            escaped = json.dumps(secret)[1:-1]
            forms.update({secret, escaped, escaped.replace("/", "\\/"), quote(secret, safe="")})
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, "***")
    for pattern, replacement in _CREDENTIALS:
        text = pattern.sub(replacement, text)
    return text if limit is None else text[:limit]


class MedAdaptError(Exception):
    """Base class for errors caused by user input (files, configs, model names)."""


class DataError(MedAdaptError):
    """A data file is missing, malformed or inconsistent."""


class ModelLoadError(MedAdaptError):
    """A model path or name cannot be resolved or loaded."""


class ConfigError(MedAdaptError):
    """A recipe or configuration is invalid."""


class MedAdaptWarning(UserWarning):
    """Something was wrong but medadapt recovered (e.g. a corrupt cache shard re-encoded, an unreadable
    checkpoint skipped); the CLI prints it as one ``warning: ...`` line."""


def warn(message: str) -> None:
    """Issue a :class:`MedAdaptWarning` (shown once per message and place, like any Python warning)."""
    import warnings

    warnings.warn(message, MedAdaptWarning, stacklevel=3)
