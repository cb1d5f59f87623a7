"""Static-embedding query tower distilled from the document encoder (near-zero query latency).

A sentence-transformers ``StaticEmbedding`` is an ``EmbeddingBag``: a query embedding is the mean of one
vector per token, no transformer pass. We fill the table model2vec-style (Tulkens & van Dongen 2024): each
token, decoded to text, is encoded by the **document** tower, so the table starts in the document
embedding space; rows are then scaled by SIF weights ``a / (a + p(token))`` (Arora et al. 2017) with token
frequencies ``p`` counted on the training texts, which down-weights stop-words in the mean. Stage-I
alignment then trains the table like any query tower. Hand-written because ``StaticEmbedding.from_distillation``
needs the ``model2vec`` package (not a dependency) and distils from a hub id, not from a loaded (possibly
fine-tuned) document tower; the PCA step of model2vec is skipped so the width stays the document width.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from medadapt.errors import ConfigError

__all__ = ["static_from_document"]


def _fast_tokenizer(model):
    from tokenizers import Tokenizer

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
    """Return a ``StaticEmbedding`` whose table is distilled from ``document_model`` (a SentenceTransformer).

    Args:
        document_model: the (symmetric) document tower; its tokenizer becomes the static tower's tokenizer.
        texts: training texts used to count token frequencies (SIF weights) and, with ``only_seen_tokens``,
            to choose which tokens to distil; ``None`` distils the whole vocabulary without weights.
        sif_a: SIF constant ``a`` (``None`` disables the weighting).
        only_seen_tokens: distil only tokens that occur in ``texts`` (others stay zero); a 150k-token LLM
            vocabulary otherwise costs 150k document-tower passes.
        batch_size: tokens encoded per document-tower batch.
    """
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

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
