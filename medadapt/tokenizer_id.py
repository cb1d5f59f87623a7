"""The identity of a tokenizer, for the keys that must change when tokenisation does (the embedding cache's
namespaces, model and adapter-base fingerprints). A module of its own so that both :mod:`medadapt.models`
and :mod:`medadapt.adapters` can use it without importing each other. Hand-written because neither
transformers nor tokenizers offers a content hash that ignores a tokenizer's per-call state."""

from __future__ import annotations

import hashlib
import json

__all__ = ["tokenizer_fingerprint"]


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable identity of what a tokenizer does to text: its ``tokenizers`` definition (vocabulary,
    normaliser such as lowercasing, pre-tokeniser, added tokens, post-processor), or the vocabulary of a
    tokenizer without that backend, plus its class, padding / truncation sides and special tokens.

    The backend's ``truncation`` and ``padding`` state is left out: the tokenizer sets it on every call
    (``max_length``, padding strategy), so it says what was called last, not what the tokenizer is."""
    h = hashlib.sha256(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}".encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = None
    if backend is not None:
        try:
            text = backend.to_str()
            text = text[text.index('"added_tokens"'):]  # keys come in a fixed order; the call state first
        except Exception:  # noqa: BLE001 - a backend that cannot serialise falls back to the vocabulary
            text = None
    if text is None:
        get_vocab = getattr(tokenizer, "get_vocab", None)
        text = json.dumps(sorted(get_vocab().items()) if callable(get_vocab) else [], ensure_ascii=False)
    h.update(text.encode("utf-8"))
    special = getattr(tokenizer, "special_tokens_map", {}) or {}
    h.update(json.dumps({"padding_side": getattr(tokenizer, "padding_side", None),
                         "truncation_side": getattr(tokenizer, "truncation_side", None),
                         "special": {k: str(v) for k, v in sorted(special.items())}},
                        sort_keys=True).encode())
    return h.hexdigest()[:24]
