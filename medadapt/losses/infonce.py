"""InfoNCE contrastive loss on cosine similarity (Med-MoE-Embed eq. 3; van den Oord et al. 2018):

    L = -log( exp(s(q, d+)) / ( sum_{d in positives} exp(s(q, d)) + sum_{d-} exp(s(q, d-)) ) ),
    s(q, d) = cos(q, d) / tau

over every positive and hard negative of the batch (gathered across processes by the loop). Unlike eq. 3,
similarities are divided by ``temperature`` (0.05 by default).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["InfoNCELoss", "cosine_candidate_scores", "fp32_cosines", "fp32_dots"]


def fp32_cosines(a: Tensor, b: Tensor) -> Tensor:
    """``(len(a), len(b))`` cosine similarities computed in float32, also under autocast: bf16's resolution
    near 1 (2^-8) rounds the close similarities of a random-init tower to one value and stalls the loss at
    ln(B). The matrix is small next to the encoders."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        return F.normalize(a.float(), dim=-1) @ F.normalize(b.float(), dim=-1).T


def fp32_dots(a: Tensor, b: Tensor) -> Tensor:
    """``(len(a), len(b))`` dot products computed in float32, also under autocast (see :func:`fp32_cosines`)."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        return a.float() @ b.float().T


def cosine_candidate_scores(query: Tensor, positive: Tensor, negatives: Tensor | None = None, *,
                            similarity: Literal["cosine", "dot"] = "cosine") -> Tensor:
    """``(B, B + B*n)`` float32 cosines (or dots) of each query to every positive of the batch, then every
    hard negative (the target of query ``i``: column ``i``); shapes checked."""
    if query.shape != positive.shape or query.dim() != 2:
        raise ValueError(f"query and positive must be (B, d); got {tuple(query.shape)}, {tuple(positive.shape)}")
    candidates = positive
    if negatives is not None:
        if negatives.dim() != 3 or negatives.shape[0] != query.shape[0]:
            raise ValueError(f"negatives must be (B, n, d); got {tuple(negatives.shape)}")
        candidates = torch.cat([positive, negatives.reshape(-1, negatives.shape[-1])], dim=0)
    return (fp32_dots if similarity == "dot" else fp32_cosines)(query, candidates)


class InfoNCELoss(nn.Module):
    """In-batch + hard-negative InfoNCE, ``{"infonce": loss}``, of ``query`` and ``positive`` ``(B, d)`` and
    optional ``negatives`` ``(B, n, d)``. ``similarity``: ``"cosine"`` (eq. 3) or ``"dot"`` (BMRetriever eq.
    2-3, as ``MultipleNegativesRankingLoss(scale=1/tau, similarity_fct=dot_score)``)."""

    def __init__(self, temperature: float = 0.05, *, similarity: Literal["cosine", "dot"] = "cosine") -> None:
        super().__init__()
        if temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {temperature}")
        if similarity not in ("cosine", "dot"):
            raise ConfigError(f"similarity must be 'cosine' or 'dot', got {similarity!r}")
        self.temperature, self.similarity = temperature, similarity

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> dict[str, Tensor]:
        scores = cosine_candidate_scores(query, positive, negatives, similarity=self.similarity)
        return {"infonce": self.from_cosines(scores)}

    def from_cosines(self, cosines: Tensor) -> Tensor:
        """The loss of similarities laid out as :func:`cosine_candidate_scores` returns them."""
        target = torch.arange(cosines.shape[0], device=cosines.device)
        return F.cross_entropy(cosines / self.temperature, target)
