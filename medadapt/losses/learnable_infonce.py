"""InfoNCE with a learnable temperature (CARE Appendix C.1.1 "unsupervised pretrain"; CLIP):
``L = -log(exp(cos(a_i, b_i) / tau) / sum_j exp(cos(a_i, b_j) / tau))`` with ``tau = exp(log_tau)`` clamped
below at ``min_temperature``; in-batch negatives, optional hard negatives.

Hand-written because sentence-transformers' losses have a fixed scale or own the model call. The loop trains
the temperature only as part of the module it trains: wrap ``(model, loss)`` in
:class:`medadapt.training.steps.TowerWithLoss`.

Example:
    >>> loss = LearnableTemperatureInfoNCELoss(temperature=0.05)
    >>> parts = loss(a, b)            # {"loss": ..., "infonce": ..., "temperature": ...}
    >>> parts["loss"].backward()      # gradients reach loss.log_temperature too
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.infonce import cosine_candidate_scores

__all__ = ["LearnableTemperatureInfoNCELoss"]


class LearnableTemperatureInfoNCELoss(nn.Module):
    """In-batch (+ hard-negative) InfoNCE whose temperature ``exp(log_temperature)`` is learned.

    Args:
        temperature: initial temperature (> 0).
        min_temperature: lower clamp of the temperature (> 0, <= ``temperature``).
        symmetric: also score ``b -> a`` and average the two directions (CLIP); off by default (SimCSE,
            the paper's eq.: one direction).
        learnable: ``False`` freezes the temperature (a fixed-temperature InfoNCE, for ablations).

    Returns ``{"loss": L, "infonce": L, "temperature": tau}`` (``loss`` is the total; ``temperature`` is
    logged, detached).
    """

    #: A training step calls the loss after the model's forward (on outputs gathered from every process),
    #: so FSDP must leave its parameter alone (medadapt.training.distributed.fsdp_outside_modules).
    called_outside_forward = True

    def __init__(self, temperature: float = 0.05, *, min_temperature: float = 0.01, symmetric: bool = False,
                 learnable: bool = True) -> None:
        super().__init__()
        if not temperature > 0 or not min_temperature > 0:
            raise ConfigError(f"temperature and min_temperature must be > 0, got {temperature}, {min_temperature}")
        if min_temperature > temperature:
            raise ConfigError(f"min_temperature ({min_temperature}) must not exceed temperature ({temperature})")
        # shape (1,), not a 0-dim scalar: FSDP and DeepSpeed ZeRO flatten parameters and refuse scalars
        self.log_temperature = nn.Parameter(torch.full((1,), math.log(temperature)), requires_grad=learnable)
        self.min_log = math.log(min_temperature)
        self.symmetric = symmetric

    @property
    def temperature(self) -> float:
        """The current temperature (clamped as in ``forward``)."""
        return float(self.log_temperature.detach().clamp(min=self.min_log).exp())

    def forward(self, query: Tensor, positive: Tensor, negatives: Tensor | None = None) -> dict[str, Tensor]:
        tau = self.log_temperature.clamp(min=self.min_log).exp().reshape(())
        scores = cosine_candidate_scores(query, positive, negatives)  # the same candidates as InfoNCELoss
        target = torch.arange(query.shape[0], device=query.device)
        loss = F.cross_entropy(scores / tau.to(scores.dtype), target)
        if self.symmetric:  # b -> a: the positives' columns, transposed
            b = query.shape[0]
            loss = (loss + F.cross_entropy(scores[:, :b].T / tau.to(scores.dtype), target)) / 2
        return {"loss": loss, "infonce": loss.detach(), "temperature": tau.detach()}
