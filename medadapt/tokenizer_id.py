"""The identity of a tokenizer; it lives in :mod:`medadapt.identity` (names re-exported here)."""

from medadapt.identity import PROBES, tokenizer_fingerprint

__all__ = ["PROBES", "tokenizer_fingerprint"]
