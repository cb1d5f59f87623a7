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


class MedAdaptWarning(UserWarning):
    """Something was wrong but medadapt recovered (e.g. a corrupt cache shard re-encoded, an unreadable
    checkpoint skipped); the CLI prints it as one ``warning: ...`` line."""


def warn(message: str) -> None:
    """Issue a :class:`MedAdaptWarning` (shown once per message and place, like any Python warning)."""
    import warnings

    warnings.warn(message, MedAdaptWarning, stacklevel=3)
