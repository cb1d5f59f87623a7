"""Old path of :mod:`medadapt.adapters.linear`'s heads, for folders saved before the move."""

from __future__ import annotations

from medadapt.adapters.linear import LinearHead, SearchAdaptorHead

__all__ = ["LinearHead", "SearchAdaptorHead"]
