"""Input squashing that keeps KAN inputs inside the spline grid.

B-splines are only non-zero on their grid, so unbounded inputs (raw backbone embeddings, hidden activations)
would fall off the learnable part of every edge function. Choices, by name:

* ``"layernorm_tanh"`` (default): a non-affine LayerNorm standardises the scale whatever backbone produced
  the vector, then ``tanh`` maps it strictly inside the grid range. Robust to backbones whose raw pooled
  embeddings have very different norms.
* ``"tanh"``: ``tanh`` only; keeps the relative scale of the features.
* ``"none"``: the caller guarantees inputs already lie in the grid range.

Whatever the choice, the result is affinely mapped onto ``grid_range``.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["SquashKind", "Squash"]

SquashKind = Literal["layernorm_tanh", "tanh", "none"]


class Squash(nn.Module):
    """Map features into ``grid_range`` (see module docstring for the choices)."""

    def __init__(self, dim: int, kind: SquashKind, grid_range: tuple[float, float]) -> None:
        super().__init__()
        if kind not in get_args(SquashKind):
            raise ConfigError(f"Unknown squash {kind!r}; valid: {list(get_args(SquashKind))}")
        self.kind = kind
        self.norm = nn.LayerNorm(dim, elementwise_affine=False) if kind == "layernorm_tanh" else None
        low, high = grid_range
        self.center = (high + low) / 2.0
        self.half_width = (high - low) / 2.0

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "none":
            return x
        if self.norm is not None:
            x = self.norm(x)
        return self.center + self.half_width * torch.tanh(x)
