"""HyReC total loss (eq. 12-14): ``L = w_lex L_lex + w_den L_den + w_union L_union``.

``L_lex`` and ``L_den`` are InfoNCE (eq. 12, in-batch + hard negatives, temperature ``tau``) on the
normalised term-weight vectors and dense vectors (the Normalisation Module: InfoNCE's cosine *is* the dot
product of L2-normalised vectors); ``L_union`` is :class:`~medadapt.losses.union_ce.UnionCELoss` (eq. 13).
The paper sums the three with weight 1; each weight is named and configurable here (0 disables a part).
"""

from __future__ import annotations

from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.infonce import InfoNCELoss
from medadapt.losses.union_ce import UnionCELoss

__all__ = ["HyReCLoss"]


class HyReCLoss(nn.Module):
    """Returns ``{"lexical", "dense", "union", "loss"}`` (``loss`` is the weighted sum).

    Args:
        temperature: InfoNCE ``tau`` (0.05 in the paper).
        lexical_weight / dense_weight / union_weight: weights of the three parts.

    Inputs (any part may be ``None`` when its weight is 0):
        lexical: ``(q (B, V), pos (B, V), neg (B, n, V) | None)`` term vectors.
        dense: ``(q (B, D), pos (B, D), neg (B, n, D) | None)``.
        union: ``(logits (N, T, 4), labels (N, T))``.

    Example:
        >>> out = HyReCLoss()(lexical=(q_t, p_t, n_t), dense=(q_d, p_d, n_d), union=(logits, labels))
        >>> out["loss"].backward()
    """

    def __init__(self, temperature: float = 0.05, lexical_weight: float = 1.0, dense_weight: float = 1.0,
                 union_weight: float = 1.0) -> None:
        super().__init__()
        if min(lexical_weight, dense_weight, union_weight) < 0:
            raise ConfigError("loss weights must be >= 0")
        if lexical_weight == dense_weight == union_weight == 0:
            raise ConfigError("at least one loss weight must be > 0")
        self.infonce = InfoNCELoss(temperature)
        self.union_ce = UnionCELoss()
        self.weights = {"lexical": float(lexical_weight), "dense": float(dense_weight),
                        "union": float(union_weight)}

    def forward(self, lexical=None, dense=None, union=None) -> dict[str, Tensor]:
        parts: dict[str, Tensor] = {}
        if self.weights["lexical"] > 0:
            if lexical is None:
                raise ValueError("lexical inputs are required when lexical_weight > 0")
            parts["lexical"] = self.infonce(*lexical)["infonce"]
        if self.weights["dense"] > 0:
            if dense is None:
                raise ValueError("dense inputs are required when dense_weight > 0")
            parts["dense"] = self.infonce(*dense)["infonce"]
        if self.weights["union"] > 0:
            if union is None:
                raise ValueError("union inputs are required when union_weight > 0")
            parts["union"] = self.union_ce(*union)["union"]
        total = sum(self.weights[k] * v for k, v in parts.items())
        return {**parts, "loss": total}
