"""Entry-point discovery shared by medadapt's registries (recipe kinds, adapter types, branches).

Each registry keeps its own table; a plugin module registers itself when imported. :func:`load_group`
imports, once per group, every module of an entry-point group whose name is not registered yet.
"""

from __future__ import annotations

from collections.abc import Callable, Container

from medadapt.errors import ConfigError

__all__ = ["load_group", "lookup"]

_loaded: set[str] = set()


def load_group(group: str, registered: Container[str],
               on_error: Callable[[str, ImportError], None] | None = None) -> None:
    """Import the modules of entry-point ``group`` not yet in ``registered`` (once per group); an
    ``ImportError`` (a plugin whose optional dependencies are missing) goes to ``on_error(name, error)``,
    or is ignored."""
    if group in _loaded:
        return
    _loaded.add(group)
    from importlib.metadata import entry_points

    for ep in entry_points(group=group):
        if ep.name not in registered:
            try:
                ep.load()
            except ImportError as exc:
                if on_error is not None:
                    on_error(ep.name, exc)


def lookup(group: str, registry: dict, name: str, what: str):
    """``registry[name]``, loading the entry points of ``group`` first if ``name`` is unknown; an unknown name
    is a :class:`~medadapt.errors.ConfigError` listing the valid ones."""
    if name not in registry:
        load_group(group, registry)
    if name not in registry:
        raise ConfigError(f"unknown {what} {name!r} (valid: {', '.join(sorted(registry)) or 'none'})")
    return registry[name]

