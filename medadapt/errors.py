"""Exception types. Every error meant for a user derives from :class:`MedAdaptError`; the CLI prints
its message on one line and exits non-zero, without a traceback."""

from __future__ import annotations


class MedAdaptError(Exception):
    """Base class for errors caused by user input (files, configs, model names)."""


class DataError(MedAdaptError):
    """A data file is missing, malformed or inconsistent."""


class ModelLoadError(MedAdaptError):
    """A model path or name cannot be resolved or loaded."""


class ConfigError(MedAdaptError):
    """A recipe or configuration is invalid."""
