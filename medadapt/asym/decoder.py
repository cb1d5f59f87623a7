"""CARE's decoder-LLM document tower: :mod:`medadapt.decoder` (shared with BMRetriever), re-exported here;
model folders saved with ``medadapt.asym.decoder.EosTransformer`` in their ``modules.json`` load through it."""

from __future__ import annotations

from medadapt.decoder import EosTransformer, append_eos, decoder_tower_modules

__all__ = ["EosTransformer", "append_eos", "decoder_tower_modules"]
