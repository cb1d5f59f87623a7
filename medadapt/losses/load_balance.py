"""Auxiliary load-balancing loss for routed experts (Switch Transformer, Fedus et al. 2022, eq. 4-6).

Med-MoE-Embed (paper §III-D) adds a load-balancing term with a *small* weight because its experts are
architecturally different and should be allowed to specialise; the paper does not print the formula, so we
use the Switch-Transformer form

    L_aux = N * sum_i f_i * P_i,

where ``N`` is the number of routed experts, ``f_i`` the fraction of routing assignments (top-k slots) that
went to expert ``i`` in the batch and ``P_i`` the mean router probability of expert ``i``. ``L_aux = 1``
for perfectly uniform routing and grows up to ``N`` as routing collapses onto one expert. Only ``P`` carries
gradient (``f`` comes from a hard top-k).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["switch_load_balance", "LoadBalanceLoss"]


def switch_load_balance(router_probs: Tensor, selected: Tensor) -> Tensor:
    """``N * sum_i f_i * P_i`` for ``router_probs`` ``(batch, N)`` and a boolean top-k mask ``selected``
    ``(batch, N)`` (see module docstring)."""
    n_experts = router_probs.shape[-1]
    assignments = selected.to(router_probs.dtype).sum(0)
    fraction = assignments / assignments.sum().clamp_min(1.0)
    mean_prob = router_probs.mean(0)
    return n_experts * torch.sum(fraction.detach() * mean_prob)


class _HasAuxLoss(Protocol):
    last_aux_loss: Tensor


class LoadBalanceLoss(nn.Module):
    """Weighted load-balancing term, returned as ``{"load_balance": weight * L_aux}``.

    Args:
        weight: multiplier of ``L_aux`` in the total loss (paper: "a smaller value"; default 0.01,
            Switch Transformer's value).

    Inputs:
        ``aux``: either the unweighted ``L_aux`` tensor (e.g. ``features["moe_aux_loss"]``) or a head exposing
        ``last_aux_loss`` (e.g. :class:`medadapt.heads.MoEHead` after its forward pass).

    Example:
        >>> loss_fn = LoadBalanceLoss(weight=0.01)
        >>> parts = loss_fn(head)          # after out = head({"sentence_embedding": v})
        >>> total = infonce_parts["infonce"] + parts["load_balance"]
    """

    def __init__(self, weight: float = 0.01) -> None:
        super().__init__()
        if weight < 0:
            raise ConfigError(f"weight must be >= 0, got {weight}")
        self.weight = weight

    def forward(self, aux: Tensor | _HasAuxLoss) -> dict[str, Tensor]:
        value = aux if isinstance(aux, Tensor) else aux.last_aux_loss
        return {"load_balance": self.weight * value}
