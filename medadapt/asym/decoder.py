"""Old path of :class:`medadapt.decoder.EosTransformer`, for folders saved before the rename."""

from __future__ import annotations

from medadapt.decoder import EosTransformer

__all__ = ["EosTransformer"]
