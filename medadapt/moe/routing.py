"""Top-k router over routed experts (paper eq. 2): affinity ``s_i = softmax_i(v^T e_i)`` over learnable
centroids, the ``k`` largest kept (renormalised to sum 1 unless ``renormalize=False``, the paper's raw scores).
Modes: ``learned``, ``random`` (warm-up: ``k`` uniform experts at ``1/k``) and ``off`` (the head skips routing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.load_balance import switch_load_balance

__all__ = ["RoutingMode", "RoutingDecision", "TopKRouter"]

RoutingMode = Literal["learned", "random", "off"]


@dataclass
class RoutingDecision:
    """A batch of ``N`` inputs routed over ``E`` experts: gate values ``weights`` (zero where not selected),
    the boolean top-k mask ``selected``, the affinities ``probs`` (all ``(N, E)``) and the unweighted
    load-balancing loss ``aux_loss`` (``N * sum f_i P_i``)."""

    weights: Tensor
    selected: Tensor
    probs: Tensor
    aux_loss: Tensor


class TopKRouter(nn.Module):
    """Learnable-centroid top-k gate over ``num_experts`` (module docstring); ``renormalize``: the kept gate
    values sum to 1; ``init_std``: of the initial centroids (small = near-uniform routing at start)."""

    def __init__(self, dim: int, num_experts: int, top_k: int, renormalize: bool, init_std: float) -> None:
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ConfigError(f"top_k must be in [1, {num_experts}], got {top_k}")
        self.num_experts, self.top_k, self.renormalize = num_experts, top_k, renormalize
        self.centroids = nn.Parameter(torch.randn(num_experts, dim) * init_std)
        # Diagnostics only: not saved with the weights.
        self.register_buffer("running_counts", torch.zeros(num_experts, dtype=torch.float64), persistent=False)
        self.register_buffer("last_load", torch.zeros(num_experts), persistent=False)
        self.inputs_seen = 0

    def forward(self, v: Tensor, mode: RoutingMode = "learned", noise: Tensor | None = None) -> RoutingDecision:
        """Route ``v`` (rows, dim). ``noise`` (rows, num_experts), random mode only: the uniform scores whose
        top-k pick the experts (default ``torch.rand``); a trainer passes each process its rows of one
        seeded global draw so that N processes route exactly like one."""
        if mode not in get_args(RoutingMode) or mode == "off":
            raise ConfigError(f"router mode must be 'learned' or 'random', got {mode!r}")
        probs = torch.softmax(v @ self.centroids.T, dim=-1)
        if noise is not None and tuple(noise.shape) != tuple(probs.shape):
            raise ValueError(f"routing noise must have shape {tuple(probs.shape)}, got {tuple(noise.shape)}")
        if mode == "learned":
            kept, index = probs.topk(self.top_k, dim=-1)
            if self.renormalize:
                kept = kept / kept.sum(-1, keepdim=True)
        else:
            scores = torch.rand(probs.shape, device=v.device) if noise is None else noise.to(v.device)
            index = scores.topk(self.top_k, dim=-1).indices
            kept = torch.full(index.shape, 1.0 / self.top_k, dtype=v.dtype, device=v.device)
        weights = torch.zeros_like(probs).scatter(-1, index, kept.to(probs.dtype))  # autocast may differ
        selected = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, index, True)
        self._record(selected)
        return RoutingDecision(weights, selected, probs, switch_load_balance(probs, selected))

    @torch.no_grad()
    def _record(self, selected: Tensor) -> None:
        counts = selected.sum(0)
        self.last_load.copy_(counts.float() / counts.sum().clamp_min(1))
        self.running_counts += counts.to(self.running_counts.dtype)
        self.inputs_seen += selected.shape[0]

    def stats(self) -> dict[str, list[float] | int]:
        """Per-expert load fractions: ``last_load`` (last batch) and ``running_load`` (since last reset),
        plus raw ``running_counts`` and ``inputs_seen``."""
        total = float(self.running_counts.sum())
        running = (self.running_counts / total).tolist() if total else [0.0] * self.num_experts
        return {"last_load": self.last_load.tolist(), "running_load": running,
                "running_counts": [int(c) for c in self.running_counts.tolist()], "inputs_seen": self.inputs_seen}

    def reset_stats(self) -> None:
        self.running_counts.zero_()
        self.last_load.zero_()
        self.inputs_seen = 0
