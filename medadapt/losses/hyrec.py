"""HyReC total loss (eq. 12-14): ``L = w_lex L_lex + w_den L_den + w_union L_union`` (+ ``w_hyb L_hyb``).

``L_lex`` and ``L_den`` are InfoNCE (eq. 12, in-batch + hard negatives, temperature ``tau``) on the
normalised term-weight vectors and dense vectors (the Normalisation Module: InfoNCE's cosine *is* the dot
product of L2-normalised vectors); ``L_union`` is :class:`~medadapt.losses.union_ce.UnionCELoss` (eq. 13).
The paper sums the three with weight 1; each weight is named and configurable here (0 disables a part).

``L_hyb`` is not in the paper (default weight 0): InfoNCE on the *fused* score the hybrid index ranks by,
``(cos_lex + hybrid_dense_weight * cos_den) / tau`` over the same candidates (eq. 9's sum inside the
softmax). With the dense vectors fixed (a lexical branch beside a trained dense model) it trains the lexical
side on what the dense side still gets wrong, the complementary training of CLEAR (Gao et al. 2021, there
for a dense residual beside BM25). No library loss scores two representations' sum, hence this term.
"""

from __future__ import annotations

from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.infonce import InfoNCELoss, cosine_candidate_scores
from medadapt.losses.union_ce import UnionCELoss

__all__ = ["HyReCLoss"]


class HyReCLoss(nn.Module):
    """Returns ``{"lexical", "dense", "union", "hybrid", "loss"}`` (parts with weight 0 left out; ``loss`` is
    the weighted sum).

    Args:
        temperature: InfoNCE ``tau`` (0.05 in the paper).
        lexical_weight / dense_weight / union_weight: weights of the paper's three parts.
        hybrid_weight: weight of the fused-score term (module docstring; 0: off, the paper).
        hybrid_dense_weight: the dense side's weight inside the fused score (``lexical + w * dense``).

    Inputs (any part may be ``None`` when its weight is 0):
        lexical: ``(q (B, V), pos (B, V), neg (B, n, V) | None)`` term vectors.
        dense: ``(q (B, D), pos (B, D), neg (B, n, D) | None)``.
        union: ``(logits (N, T, 4), labels (N, T))``.
        hybrid: ``(lexical, dense)`` as above, for the fused term (gradients flow wherever the inputs have them).

    Example:
        >>> out = HyReCLoss()(lexical=(q_t, p_t, n_t), dense=(q_d, p_d, n_d), union=(logits, labels))
        >>> out["loss"].backward()
    """

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
        """``(B, B + B*n)`` fused similarities ``cos_lex + hybrid_dense_weight * cos_den`` (before ``tau``) over
        the candidates of :func:`~medadapt.losses.infonce.cosine_candidate_scores` (target of query ``i``:
        column ``i``)."""
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
