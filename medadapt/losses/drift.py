"""An L2 pull of adapted embeddings toward the frozen ones (Search-Adaptor's regularisation, Yoon et al., ACL
2024), so a small training set cannot drag them far from what the backbone knows:

    L_drift = weight * mean_rows || e'/|e'| - e/|e| ||^2

on the rows a head maps, both sides L2-normalised as retrieval sees them (value in ``[0, 4]``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["DriftLoss"]


class DriftLoss(nn.Module):
    """``{"drift": weight * mean ||normalize(adapted) - normalize(frozen)||^2}`` over ``(rows, d)`` raw
    embeddings before and after the head (weight 0: a zero part without gradient)."""

    def __init__(self, weight: float = 0.0) -> None:
        super().__init__()
        if not weight >= 0:
            raise ConfigError(f"drift weight must be >= 0, got {weight}")
        self.weight = float(weight)

    def forward(self, frozen: Tensor, adapted: Tensor) -> dict[str, Tensor]:
        if frozen.shape != adapted.shape:
            raise ConfigError(f"frozen {tuple(frozen.shape)} and adapted {tuple(adapted.shape)} rows differ")
        if self.weight == 0 or adapted.shape[0] == 0:
            return {"drift": adapted.new_zeros(())}
        a = torch.nn.functional.normalize(adapted.float(), dim=-1)
        f = torch.nn.functional.normalize(frozen.float(), dim=-1)
        return {"drift": self.weight * (a - f).pow(2).sum(-1).mean()}
