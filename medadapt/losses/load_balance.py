"""Auxiliary load-balancing loss for routed experts (Switch Transformer, Fedus et al. 2022, eq. 4-6), the
small-weight term of Med-MoE-Embed §III-D (which prints no formula):

    L_aux = N * sum_i f_i * P_i

with ``N`` routed experts, ``f_i`` the fraction of top-k assignments to expert ``i`` and ``P_i`` its mean
router probability: 1 for uniform routing, up to ``N`` when it collapses. Only ``P`` carries gradient.
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
    """``{"load_balance": weight * L_aux}`` (default weight 0.01, Switch Transformer's; the paper says "a
    smaller value") of an ``L_aux`` tensor or of a head exposing ``last_aux_loss`` after its forward."""

    def __init__(self, weight: float = 0.01) -> None:
        super().__init__()
        if weight < 0:
            raise ConfigError(f"weight must be >= 0, got {weight}")
        self.weight = weight

    def forward(self, aux: Tensor | _HasAuxLoss) -> dict[str, Tensor]:
        value = aux if isinstance(aux, Tensor) else aux.last_aux_loss
        return {"load_balance": self.weight * value}
