"""Recipe kinds: the registered systems (:mod:`medadapt.systems`, found through its entry points) as
``medadapt train`` sees them: :func:`get_kind` of a recipe's ``kind:``."""

from __future__ import annotations

from typing import Any

from medadapt import systems
from medadapt.errors import ConfigError
from medadapt.systems import System, register_system

__all__ = ["RecipeKind", "get_kind", "kinds", "register_system"]

#: A system as the runner sees it (the name older code uses).
RecipeKind = System


def kinds() -> list[str]:
    """The registered recipe kinds (systems with a recipe schema)."""
    return sorted(s.kind for s in systems.registered() if s.schema is not None)


def get_kind(kind: Any, source: str = "recipe") -> System:
    """The registered system for ``kind``; an unknown kind lists the valid ones."""
    if kind is None:
        raise ConfigError(f"{source}: no 'kind:' (valid: {', '.join(kinds())})")
    if not isinstance(kind, str):
        raise ConfigError(f"{source}: 'kind' must be a string")
    found = systems.find(kind)
    if found is None and systems.broken(kind):
        raise ConfigError(f"{source}: recipe kind {kind!r} cannot be loaded: {systems.broken(kind)}")
    if found is None or found.schema is None:
        raise ConfigError(f"{source}: unknown recipe kind {kind!r} (valid: {', '.join(kinds())})")
    return found
