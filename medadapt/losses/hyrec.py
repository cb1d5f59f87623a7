"""HyReC total loss (eq. 12-14): ``L = w_lex L_lex + w_den L_den + w_union L_union`` (+ ``w_hyb L_hyb``).

``L_lex`` / ``L_den``: InfoNCE on the normalised term-weight and dense vectors (eq. 12); ``L_union``:
:class:`~medadapt.losses.union_ce.UnionCELoss` (eq. 13); the paper's weights are 1. ``L_hyb`` (not in the
paper, default 0): InfoNCE on the fused score the hybrid index ranks by, ``(cos_lex + w * cos_den) / tau``,
which trains a lexical side beside fixed dense vectors on what the dense side gets wrong (CLEAR, Gao et al.
2021). No library loss scores two representations' sum.
"""

from __future__ import annotations

from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.infonce import InfoNCELoss, cosine_candidate_scores
from medadapt.losses.union_ce import UnionCELoss

__all__ = ["HyReCLoss"]


class HyReCLoss(nn.Module):
    """``{"lexical", "dense", "union", "hybrid", "loss"}`` (weight-0 parts left out; ``loss``: the weighted
    sum). Inputs: ``lexical`` / ``dense`` as ``(q, pos, neg | None)``, ``union`` as ``(logits, labels)``,
    ``hybrid`` as ``(lexical, dense)`` (a part may be ``None`` when its weight is 0);
    ``hybrid_dense_weight``: the dense side's weight inside the fused score."""

    def __init__(self, temperature: float = 0.05, lexical_weight: float = 1.0, dense_weight: float = 1.0,
                 union_weight: float = 1.0, hybrid_weight: float = 0.0, hybrid_dense_weight: float = 1.0) -> None:
        super().__init__()
        if min(lexical_weight, dense_weight, union_weight, hybrid_weight, hybrid_dense_weight) < 0:
            raise ConfigError("loss weights must be >= 0")
        if lexical_weight == dense_weight == union_weight == hybrid_weight == 0:
            raise ConfigError("at least one loss weight must be > 0")
        self.infonce = InfoNCELoss(temperature)
        self.union_ce = UnionCELoss()
        self.weights = {"lexical": float(lexical_weight), "dense": float(dense_weight),
                        "union": float(union_weight), "hybrid": float(hybrid_weight)}
        self.hybrid_dense_weight = float(hybrid_dense_weight)

    def fused_scores(self, lexical, dense) -> Tensor:
        """``cos_lex + hybrid_dense_weight * cos_den`` over the candidates of ``cosine_candidate_scores``."""
        lex, den = cosine_candidate_scores(*lexical), cosine_candidate_scores(*dense)
        if lex.shape != den.shape:
            raise ValueError(f"lexical and dense candidate sets differ: {tuple(lex.shape)} vs {tuple(den.shape)}")
        return lex + self.hybrid_dense_weight * den.to(lex.dtype)

    def forward(self, lexical=None, dense=None, union=None, hybrid=None) -> dict[str, Tensor]:
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
        if self.weights["hybrid"] > 0:
            if hybrid is None:
                raise ValueError("hybrid inputs (lexical, dense) are required when hybrid_weight > 0")
            parts["hybrid"] = self.infonce.from_cosines(self.fused_scores(*hybrid))
        total = sum(self.weights[k] * v for k, v in parts.items())
        return {**parts, "loss": total}
