"""The identity of a tokenizer, for the keys that must change when tokenisation does (the embedding cache's
namespaces, model and adapter-base fingerprints, HyReC's state cache). A module of its own so that
:mod:`medadapt.models`, :mod:`medadapt.adapters` and the systems can use it without importing each other.

The identity is **behavioural**: the vocabulary (token -> id), the special tokens, the padding side, and the
ids the tokenizer gives a fixed set of probe texts (upper and lower case, accents, digits, punctuation,
Chinese, a long word, extra spaces, text that looks like a special token). So the same tokenizer gives the
same fingerprint whatever Python class loaded it (``BertTokenizerFast`` under transformers 4,
``BertTokenizer`` / ``TokenizersBackend`` under 5) and whatever ``tokenizers`` version serialised it, while a
change that alters what text becomes (lowercasing off, another vocabulary, added tokens, another
normaliser or pre-tokeniser) changes it. Its per-call truncation and padding state is never read.
Hand-written because neither transformers nor tokenizers offers a content hash of a tokenizer.
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["PROBES", "tokenizer_fingerprint"]

#: Texts whose token ids enter the fingerprint (what differs between normalisers and pre-tokenisers).
PROBES = (
    "What are the Symptoms of GOUT? Uric-acid crystals; 2,500 mg/dL at 37.5°C.",
    "Café naïve Ångström résumé ÆØ ß İ",
    "高血压患者应该注意什么？糖尿病、心脏病。",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "  multiple   spaces\tand\ttabs\nnew line  ",
    "[CLS] <s> </s> <|endoftext|> [MASK] <unk> #hashtag @user e-mail@example.org https://x.y/z?a=1",
    "ÉMOJI 😀 ☺ ﬁ ① Ⅻ ｆｕｌｌｗｉｄｔｈ",
)


def _vocab_text(vocab: dict[str, int]) -> str:
    """The vocabulary as one JSON text in id order (tokens by id when the ids are dense, the usual case:
    a list indexed by id is ~3x faster to build than sorting the pairs)."""
    ids = list(vocab.values())
    if ids and min(ids) >= 0 and max(ids) < 2 * len(ids):
        by_id: list = [None] * (max(ids) + 1)
        for token, i in vocab.items():
            by_id[i] = token
        return json.dumps(by_id, ensure_ascii=False)
    return json.dumps(sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])), ensure_ascii=False)


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable identity of what ``tokenizer`` does to text (module docstring)."""
    h = hashlib.sha256(b"medadapt-tokenizer-1")
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if callable(get_vocab) else {}
    h.update(_vocab_text(vocab).encode("utf-8", "surrogatepass"))
    special = getattr(tokenizer, "special_tokens_map", {}) or {}
    h.update(json.dumps({"padding_side": getattr(tokenizer, "padding_side", None),
                         "special": {k: str(v) for k, v in sorted(special.items())}},
                        sort_keys=True, ensure_ascii=False).encode("utf-8"))
    try:
        ids = [tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"] for text in PROBES]
    except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot encode the probes still has a vocabulary
        ids = [type(exc).__name__]
    h.update(json.dumps(ids).encode("utf-8"))
    return h.hexdigest()[:24]
