"""Decoder-LLM encoders shared by every system (CARE's document tower, BMRetriever): :class:`EosTransformer`
appends the tokenizer's EOS after each sequence's last real token (right or left padding) for ST's
``Pooling("lasttoken")``. Hand-written: sentence-transformers cannot append EOS for non-chat decoders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from sentence_transformers.base.modules import Normalize, Transformer
from torch import Tensor

from medadapt.errors import ConfigError

__all__ = ["EosTransformer", "append_eos", "decoder_tower_modules", "strip_normalize"]


def append_eos(input_ids: Tensor, attention_mask: Tensor, eos_id: int, pad_id: int) -> tuple[Tensor, Tensor]:
    """Insert ``eos_id`` right after each row's last attended token (right or left padding); returns
    ``(ids, mask)``, one column wider unless every EOS fitted into padding. A row ending in ``eos_id`` is left."""
    batch, length = input_ids.shape
    ids = torch.cat([input_ids, input_ids.new_full((batch, 1), pad_id)], dim=1)
    mask = torch.cat([attention_mask, attention_mask.new_zeros((batch, 1))], dim=1)
    has_tokens = attention_mask.bool().any(dim=1)
    last = length - 1 - attention_mask.flip(1).to(torch.int64).argmax(dim=1)
    last = torch.where(has_tokens, last, torch.full_like(last, -1))
    already = has_tokens & (input_ids.gather(1, last.clamp(min=0).unsqueeze(1)).squeeze(1) == eos_id)
    pos = (last + 1).unsqueeze(1)
    rows = ~already
    ids[rows] = ids[rows].scatter(1, pos[rows], eos_id)
    mask[rows] = mask[rows].scatter(1, pos[rows], 1)
    if not bool(mask[:, -1].any()):
        # No row needed the extra column (every EOS fitted into existing padding): drop it.
        ids, mask = ids[:, :-1], mask[:, :-1]
    return ids, mask


class EosTransformer(Transformer):
    """``Transformer`` that appends EOS to every text, truncating to ``max_seq_length - 1`` tokens
    so it fits; saves and loads like ST's ``Transformer`` (``trust_remote_code=True``)."""

    def __init__(self, model_name_or_path: str, **kwargs: Any) -> None:
        kwargs.setdefault("unpad_inputs", False)  # EOS is appended on padded tensors
        super().__init__(model_name_or_path, **kwargs)
        tok = self.tokenizer
        if tok is None or tok.eos_token_id is None:
            raise ConfigError(f"{model_name_or_path!r}: the tokenizer has no eos_token; "
                              "EosTransformer needs one")
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token  # decoder tokenizers often have none; the mask marks padding

    def preprocess(self, inputs: Sequence[Any], prompt: str | None = None,
                   processing_kwargs: dict | None = None, **kwargs: Any) -> dict[str, Any]:
        if not inputs or not all(isinstance(x, str) for x in inputs):
            if inputs:
                raise ValueError("EosTransformer encodes plain texts only")
            return super().preprocess(inputs, prompt=prompt, processing_kwargs=processing_kwargs, **kwargs)
        if kwargs.get("max_length") is not None:
            kwargs["max_length"] = int(kwargs["max_length"]) - 1
        else:
            limit = self.max_seq_length
            if limit is not None and limit < 10**9:
                text_kwargs = {**((processing_kwargs or {}).get("text") or {})}
                text_kwargs.setdefault("max_length", int(limit) - 1)
                processing_kwargs = {**(processing_kwargs or {}), "text": text_kwargs}
        features = super().preprocess(inputs, prompt=prompt, processing_kwargs=processing_kwargs, **kwargs)
        tok = self.tokenizer
        ids, mask = append_eos(features["input_ids"], features["attention_mask"], tok.eos_token_id,
                               tok.pad_token_id)
        features["input_ids"], features["attention_mask"] = ids, mask
        if "token_type_ids" in features:
            tt = features["token_type_ids"]
            extra = tt.new_zeros((tt.shape[0], ids.shape[1] - tt.shape[1]))
            features["token_type_ids"] = torch.cat([tt, extra], 1)
        return features


def decoder_tower_modules(model_name_or_path: str, max_seq_length: int | None = None,
                          padding_side: str = "right", model_kwargs: dict | None = None) -> list:
    """``[EosTransformer, Pooling("lasttoken")]`` for a decoder LLM (any ``AutoModel`` checkpoint)."""
    from sentence_transformers.sentence_transformer.modules import Pooling

    if padding_side not in ("left", "right"):
        raise ConfigError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    transformer = EosTransformer(model_name_or_path, model_kwargs=model_kwargs or {})
    if max_seq_length is not None:
        transformer.max_seq_length = max_seq_length
    transformer.tokenizer.padding_side = padding_side
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="lasttoken")
    return [transformer, pooling]


def strip_normalize(modules: Sequence) -> list:
    """``modules`` without trailing ``Normalize`` modules (a model that normalises adds one, once, at the end)."""
    modules = list(modules)
    while modules and isinstance(modules[-1], Normalize):
        modules.pop()
    return modules
