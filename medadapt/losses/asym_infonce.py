"""Asymmetric InfoNCE (CARE §4.2.1 eq. 1, §4.2.2 eq. 4): queries through the small query tower, targets through
the large document tower; candidates are every target and hard negative of the (gathered) batch. Stage I
pairs a text with itself (student vs cached teacher embedding), stage II a query with its positive. As in
every medadapt InfoNCE, cosines are divided by ``temperature``. Hand-written because sentence-transformers'
losses run the model themselves and cannot take cached teacher embeddings.
"""

from __future__ import annotations

from torch import Tensor

from medadapt.losses.infonce import InfoNCELoss, cosine_candidate_scores

__all__ = ["AsymInfoNCELoss"]


class AsymInfoNCELoss(InfoNCELoss):
    """Query-tower vs document-tower InfoNCE, ``{"asym_infonce": loss}``, for ``query`` ``(B, d)`` (student),
    ``target`` ``(B, d)`` (teacher, may carry no gradient) and optional ``negatives`` ``(B, n, d)``."""

    def __init__(self, temperature: float = 0.05) -> None:
        super().__init__(temperature)

    def forward(self, query: Tensor, target: Tensor, negatives: Tensor | None = None) -> dict[str, Tensor]:
        if query.dim() != 2 or query.shape != target.shape:
            raise ValueError(
                f"query and target must both be (B, d) with the same d (truncate the document embedding to the "
                f"query dimension first, e.g. with MatryoshkaTruncate); got {tuple(query.shape)}, "
                f"{tuple(target.shape)}"
            )
        if negatives is not None and (negatives.dim() != 3 or negatives.shape[::2] != (query.shape[0], query.shape[1])):
            raise ValueError(f"negatives must be (B, n, d) matching query; got {tuple(negatives.shape)}")
        return {"asym_infonce": self.from_cosines(cosine_candidate_scores(query, target, negatives))}
