"""Matryoshka Representation Learning loss (Kusupati et al. 2022; CARE Appendix C.1.2 eq. 5): the wrapped
loss averaged over nested prefix dimensions, ``1/|M| sum_m L(q[:m], d+[:m], d-[:m])``. Applied to the
embeddings, not by patching the model's forward as sentence-transformers' ``MatryoshkaLoss`` does, so any
medadapt loss returning parts can be wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["MatryoshkaLoss"]


class MatryoshkaLoss(nn.Module):
    """Average ``loss(query, positive, negatives) -> parts`` over the nested prefixes ``dims`` (distinct, each
    at most the embedding's width), with optional ``weights`` (normalised; default uniform, eq. 5). The last
    call's per-dimension parts are in :attr:`last_per_dim`, for logging only."""

    def __init__(self, loss: nn.Module, dims: Sequence[int], weights: Sequence[float] | None = None) -> None:
        super().__init__()
        dims = [int(d) for d in dims]
        if not dims or min(dims) < 1 or len(set(dims)) != len(dims):
            raise ConfigError(f"dims must be distinct positive integers, got {dims}")
        if weights is not None:
            if len(weights) != len(dims) or min(weights) < 0 or sum(weights) <= 0:
                raise ConfigError("weights must be one non-negative value per dim, not all zero")
            total = float(sum(weights))
            weights = [float(w) / total for w in weights]
        else:
            weights = [1.0 / len(dims)] * len(dims)
        self.loss = loss
        self.dims = sorted(dims)
        self.weights = [w for _, w in sorted(zip(dims, weights))]
        self.last_per_dim: dict[int, dict[str, float]] = {}

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> dict[str, Tensor]:
        full = min(query.shape[-1], positive.shape[-1])
        if self.dims[-1] > full:
            raise ValueError(f"MRL dimension {self.dims[-1]} exceeds the embedding dimension {full}")
        total: dict[str, Tensor] = {}
        self.last_per_dim = {}
        for dim, weight in zip(self.dims, self.weights):
            parts = self.loss(
                query[..., :dim], positive[..., :dim], None if negatives is None else negatives[..., :dim]
            )
            self.last_per_dim[dim] = {k: float(v.detach()) for k, v in parts.items()}
            for name, value in parts.items():
                total[name] = total[name] + weight * value if name in total else weight * value
        return total
