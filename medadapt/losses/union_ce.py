"""Semantic-union cross-entropy (HyReC eq. 13).

    L_union = - sum_i y_i log U_i ,   U_i = softmax(W_u l_i + b_u) over {S, B, M, E}

averaged over the labelled tokens; label ``-100`` (special tokens, padding) is ignored.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["UnionCELoss"]


class UnionCELoss(nn.Module):
    """``{"union": loss}``: token cross-entropy of ``(B, T, 4)`` logits against ``(B, T)`` labels."""

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, logits: Tensor, labels: Tensor) -> dict[str, Tensor]:
        if logits.dim() != 3 or logits.shape[-1] != 4 or logits.shape[:2] != labels.shape:
            raise ValueError(f"logits must be (B, T, 4) and labels (B, T); got {tuple(logits.shape)}, "
                             f"{tuple(labels.shape)}")
        if (labels != self.ignore_index).sum() == 0:
            return {"union": logits.sum() * 0.0}
        return {"union": F.cross_entropy(logits.reshape(-1, 4).float(), labels.reshape(-1),
                                         ignore_index=self.ignore_index)}
