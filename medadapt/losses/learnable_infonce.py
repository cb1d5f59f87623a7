"""InfoNCE with a learnable temperature (CARE Appendix C.1.1 "unsupervised pretrain"; CLIP): ``tau =
exp(log_tau)`` clamped below at ``min_temperature``, in-batch and optional hard negatives. Hand-written:
sentence-transformers' losses have a fixed scale or own the model call. The loop trains the temperature as
part of the module it trains (:class:`medadapt.training.steps.TowerWithLoss`).
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
    """In-batch (+ hard-negative) InfoNCE whose temperature ``exp(log_temperature)`` is learned, clamped
    below at ``min_temperature``; ``symmetric`` also scores ``b -> a`` (CLIP; off: the paper's one
    direction); ``learnable=False`` freezes it. Returns ``{"loss", "infonce", "temperature"}``."""

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
