"""The BMRetriever encoder (§3.1): one sentence-transformers model for queries and passages, either a decoder
LLM through the shared :func:`medadapt.decoder.decoder_tower_modules` (EOS + last-token pooling) or any ST
model. Dot-product similarity (Appendix E); instructions are the model's ``query`` / ``document`` prompts.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize

from medadapt.decoder import decoder_tower_modules, strip_normalize
from medadapt.errors import ConfigError
from medadapt.models import load, resolve_model_path

__all__ = ["build_retriever"]


def build_retriever(name: str, kind: Literal["decoder", "sentence_transformer"] = "decoder", *,
                    max_seq_length: int | None = None, padding_side: Literal["left", "right"] = "right",
                    torch_dtype: str | None = None, normalize: bool = False,
                    prompts: dict[str, str] | None = None, device: str | None = None):
    """Build the retriever: decoder tower (EOS pooling) or an ST model, dot-product similarity, prompts."""
    if kind == "decoder":
        kwargs: dict[str, Any] = {"dtype": getattr(torch, torch_dtype)} if torch_dtype else {}
        modules = decoder_tower_modules(resolve_model_path(name), max_seq_length, padding_side,
                                        model_kwargs=kwargs)
    elif kind == "sentence_transformer":
        base = load(name, device=device)
        if max_seq_length:
            base.max_seq_length = max_seq_length
        modules = list(base._modules.values())
    else:
        raise ConfigError(f"model kind must be 'decoder' or 'sentence_transformer', got {kind!r}")
    modules = list(strip_normalize(modules))
    if normalize:
        modules.append(Normalize())
    return SentenceTransformer(modules=modules, device=device, prompts=dict(prompts or {}),
                               similarity_fn_name="dot")

