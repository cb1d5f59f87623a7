"""Static-embedding query tower distilled from the document tower (near-zero query latency): each token,
decoded to text, is encoded by the document tower (model2vec-style, so the table starts in the document space),
rows scaled by SIF weights ``a / (a + p(token))`` counted on the training texts. Hand-written because
``StaticEmbedding.from_distillation`` needs ``model2vec`` and a hub id, not a loaded (fine-tuned) tower; no PCA,
so the width stays the document width."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch
from sentence_transformers.sentence_transformer.modules import StaticEmbedding
from tokenizers import Tokenizer

from medadapt.errors import ConfigError

__all__ = ["static_from_document"]


def _fast_tokenizer(model):
    tok = getattr(model, "tokenizer", None)
    backend = getattr(tok, "_tokenizer", tok)
    if not isinstance(backend, Tokenizer):
        raise ConfigError("static distillation needs a fast (Rust) tokenizer on the document tower")
    return tok, Tokenizer.from_str(backend.to_str())  # a copy: StaticEmbedding turns padding off


def static_from_document(
    document_model,
    texts: Sequence[str] | None = None,
    *,
    sif_a: float | None = 1e-3,
    only_seen_tokens: bool = True,
    batch_size: int = 512,
    show_progress: bool = False,
):
    """A ``StaticEmbedding`` whose table is distilled from ``document_model``.

    Args:
        texts: training texts for token frequencies (SIF) and, with ``only_seen_tokens``, the tokens to distil
            (others stay zero; a 150k-token LLM vocabulary otherwise costs 150k passes); ``None``: the whole
            vocabulary, unweighted.
        sif_a: SIF constant ``a`` (``None``: no weighting)."""
    hf_tok, tokenizer = _fast_tokenizer(document_model)
    vocab_size = tokenizer.get_vocab_size()
    special = set(getattr(hf_tok, "all_special_ids", []) or [])
    counts: Counter[int] = Counter()
    if texts is not None:
        for enc in tokenizer.encode_batch(list(texts), add_special_tokens=False):
            counts.update(enc.ids)
    if texts is not None and only_seen_tokens:
        ids = sorted(i for i in counts if i not in special and i < vocab_size)
    else:
        ids = [i for i in range(vocab_size) if i not in special]
    if not ids:
        raise ConfigError("no tokens to distil (empty texts?)")
    strings = [tokenizer.decode([i]) or tokenizer.id_to_token(i) or "" for i in ids]
    emb = document_model.encode_document(strings, batch_size=batch_size, convert_to_numpy=True,
                                         normalize_embeddings=False, show_progress_bar=show_progress)
    table = np.zeros((vocab_size, emb.shape[1]), dtype=np.float32)
    table[ids] = emb
    if sif_a is not None and counts:
        total = sum(counts.values())
        freq = np.zeros(vocab_size, dtype=np.float64)
        for i, c in counts.items():
            if i < vocab_size:
                freq[i] = c / total
        table *= (sif_a / (sif_a + freq)).astype(np.float32)[:, None]
    return StaticEmbedding(tokenizer, embedding_weights=torch.from_numpy(table))
