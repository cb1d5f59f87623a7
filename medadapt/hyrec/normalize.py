"""Normalisation Module (HyReC §3.3) and the hybrid score (eq. 9-11).

Before scoring, dense vectors are L2-normalised and each text's term-weight vector (the weights of its
valid tokens, selected with the attention mask) is L2-normalised too, so both ``S_lex`` and ``S_den`` lie
in ``[0, 1]`` / ``[-1, 1]`` and neither branch dominates the sum. The hybrid score is

    S(q, p) = S_lex(q, p) + dense_weight * S_den(q, p)

with ``dense_weight = 1`` in the paper (eq. 9); it is a fixed, documented configuration value here, not a
learned parameter.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch.nn.functional as F
from torch import Tensor

from medadapt.retrieval.fusion import hybrid_score  # eq. 9: the one hybrid score of medadapt

__all__ = ["normalize_dense", "normalize_term_weights", "normalize_sparse", "hybrid_score"]


def normalize_dense(x: Tensor, eps: float = 1e-12) -> Tensor:
    """L2-normalise dense vectors along the last dimension."""
    return F.normalize(x, dim=-1, eps=eps)


def normalize_term_weights(weights: Tensor, mask: Tensor, eps: float = 1e-12) -> Tensor:
    """Zero the weights of padding / special tokens (``mask == 0``) and L2-normalise each row.

    Args:
        weights: ``(B, T)`` term weights.
        mask: ``(B, T)`` 1 for valid tokens.
    """
    w = weights * mask.to(weights.dtype)
    return w / w.norm(dim=-1, keepdim=True).clamp_min(eps)


def normalize_sparse(vector: Mapping[int, float]) -> dict[int, float]:
    """L2-normalise a sparse ``{term_id: weight}`` vector (an all-zero vector stays empty)."""
    norm = math.sqrt(sum(v * v for v in vector.values()))
    if norm <= 0:
        return {}
    return {k: v / norm for k, v in vector.items()}
