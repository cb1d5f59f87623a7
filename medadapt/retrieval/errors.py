"""Errors raised by :mod:`medadapt.retrieval`. Both derive from :class:`medadapt.errors.MedAdaptError`,
so the CLI prints them as one ``error: ...`` line."""

from __future__ import annotations

from medadapt.errors import MedAdaptError


class IndexMismatchError(MedAdaptError):
    """An index is used with a model (or settings) other than the one it was built with."""


class IndexCorruptError(MedAdaptError):
    """An index folder is incomplete, was modified after saving, or cannot be read."""
