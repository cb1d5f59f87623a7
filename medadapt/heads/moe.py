"""Old path of :class:`medadapt.moe.head.MoEHead`, for folders saved before the move."""

from __future__ import annotations

from medadapt.moe.head import MoEHead

__all__ = ["MoEHead"]
