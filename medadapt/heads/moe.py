"""Compatibility module: model folders saved before Med-MoE-Embed moved to :mod:`medadapt.moe` name their
head ``medadapt.heads.moe.MoEHead`` in ``modules.json``; this re-export keeps them loadable. New code (and
newly saved folders) use :class:`medadapt.moe.head.MoEHead`."""

from __future__ import annotations

from medadapt.moe.head import MoEHead

__all__ = ["MoEHead"]
