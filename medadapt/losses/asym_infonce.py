"""Asymmetric InfoNCE (CARE §4.2.1 eq. 1 and §4.2.2 eq. 4): queries through the small query tower, targets
through the large document tower, candidates = every target and hard negative of the (gathered) batch.

    L = -1/B sum_i log( exp(s(q_i, d_i) / tau) / sum_{d in D_i} exp(s(q_i, d) / tau) ),  s = cosine

Stage I pairs a text with itself (student vs cached teacher embedding), stage II a query with its positive.
Unlike the paper, cosines are divided by ``temperature`` as in every medadapt InfoNCE. Hand-written because
sentence-transformers' loss runs the model itself and cannot take cached teacher embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.infonce import fp32_cosines

__all__ = ["AsymInfoNCELoss"]


class AsymInfoNCELoss(nn.Module):
    """Query-tower vs document-tower InfoNCE, returned as ``{"asym_infonce": loss}``.

    Args:
        temperature: softmax temperature ``tau`` applied to cosine similarities.

    Inputs:
        query: ``(B, d)`` query-tower (student) embeddings; normalised internally.
        target: ``(B, d)`` document-tower (teacher) embeddings of each row's positive: the same text in
            stage I, the relevant document in stage II. May carry no gradient (frozen teacher).
        negatives: optional ``(B, n, d)`` document-tower embeddings of hard negatives.

    Example:
        >>> loss = AsymInfoNCELoss(temperature=0.05)
        >>> parts = loss(student(texts), teacher_cache[texts])      # stage I, eq. 1
        >>> parts["asym_infonce"].backward()
    """

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__()
        if temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def forward(self, query: Tensor, target: Tensor, negatives: Tensor | None = None) -> dict[str, Tensor]:
        if query.dim() != 2 or query.shape != target.shape:
            raise ValueError(
                f"query and target must both be (B, d) with the same d (truncate the document embedding to the "
                f"query dimension first, e.g. with MatryoshkaTruncate); got {tuple(query.shape)}, "
                f"{tuple(target.shape)}"
            )
        candidates = target
        if negatives is not None:
            if negatives.dim() != 3 or negatives.shape[::2] != (query.shape[0], query.shape[1]):
                raise ValueError(f"negatives must be (B, n, d) matching query; got {tuple(negatives.shape)}")
            candidates = torch.cat([target, negatives.reshape(-1, negatives.shape[-1])], dim=0)
        scores = fp32_cosines(query, candidates) / self.temperature  # float32 also under autocast
        labels = torch.arange(query.shape[0], device=query.device)
        return {"asym_infonce": F.cross_entropy(scores, labels)}
