"""Old path of :class:`medadapt.care.truncate.MatryoshkaTruncate`, for folders saved before the rename."""

from __future__ import annotations

from medadapt.care.truncate import MatryoshkaTruncate

__all__ = ["MatryoshkaTruncate"]
