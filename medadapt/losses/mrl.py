"""Matryoshka Representation Learning loss (Kusupati et al. 2022; CARE Appendix C.1.2 eq. 5): the wrapped
contrastive loss averaged over nested prefix dimensions, ``L_MRL = 1/|M| sum_{m in M} L(q[:m], d+[:m], d-[:m])``,
so the first ``m`` coordinates are an embedding on their own.

Applied to embeddings (inputs sliced), not by patching the model's forward as sentence-transformers'
``MatryoshkaLoss`` does, so any medadapt loss returning a dict of parts can be wrapped.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["MatryoshkaLoss"]


class MatryoshkaLoss(nn.Module):
    """Average a loss over nested embedding prefixes (eq. 5); returns the wrapped loss's parts, each averaged.

    Args:
        loss: a loss module ``loss(query, positive, negatives=None) -> dict[str, Tensor]``
            (:class:`~medadapt.losses.InfoNCELoss`, :class:`~medadapt.losses.AsymInfoNCELoss`).
        dims: the nested dimensions ``M`` (each ``>= 1``, distinct). A dimension larger than the embedding
            raises, so a typo cannot silently train the full embedding twice.
        weights: optional per-dimension weights (normalised to sum to 1); default uniform, as in eq. 5.

    The per-dimension values of the last call are kept in :attr:`last_per_dim` (``{dim: {part: float}}``)
    for logging; they are not returned, so a trainer that sums the returned parts sums eq. 5 exactly once.

    Example:
        >>> mrl = MatryoshkaLoss(InfoNCELoss(0.05), dims=[768, 1024, 2560])
        >>> mrl(q, d_pos, d_neg)["infonce"].backward()
    """

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
