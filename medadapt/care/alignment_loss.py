"""Stage-I query-alignment objective of CARE (§4.2.1, eq. 2 and eq. 3), student ``E_Q`` (query tower),
teacher ``E_D`` (frozen document tower), the same unlabeled text ``x_i`` on both sides:

    L_MSE   = 1/B sum_i || E_Q(x_i)/|E_Q(x_i)| - E_D(x_i)/|E_D(x_i)| ||^2          (eq. 2)
    L_align = w_c * L_AsymInfoNCE + w_m * L_MSE                                      (eq. 3)

The paper's single weight on MSE is unstated; both weights are named here, so the Table-4 ablations are
``mse_weight=0`` / ``contrastive_weight=0``. ``L_MSE`` sums over dimensions (``2 - 2 cos``), so its scale does
not depend on the width, unlike ``torch.nn.MSELoss``. Optional ranking distillation (not in the paper):

    L_rank  = 1/B sum_i KL( softmax(t_i D^T / tau_r) || softmax(s_i D^T / tau_r) )

over the frozen document tower's normalised corpus embeddings ``D``: the student ranks the corpus as the
teacher does (measured in docs/benchmarks.md). Hand-written: no library ships these losses on precomputed
teacher embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.asym_infonce import AsymInfoNCELoss

__all__ = ["NormalizedMSELoss", "QueryAlignmentLoss"]


class NormalizedMSELoss(nn.Module):
    """Eq. 2: ``{"mse": mean_i ||norm(student_i) - norm(teacher_i)||^2}`` on ``(B, d)`` inputs."""

    def forward(self, student: Tensor, teacher: Tensor) -> dict[str, Tensor]:
        if student.shape != teacher.shape or student.dim() != 2:
            raise ValueError(f"student and teacher must be (B, d); got {tuple(student.shape)}, "
                             f"{tuple(teacher.shape)}")
        diff = F.normalize(student.float(), dim=-1) - F.normalize(teacher.float(), dim=-1)
        return {"mse": diff.pow(2).sum(dim=-1).mean()}


class QueryAlignmentLoss(nn.Module):
    """Eq. 3 plus the optional ``L_rank``; returns the *weighted* parts ``asym_infonce``, ``mse``,
    ``rank_kl`` (a zero-weight part is left out).

    Args:
        contrastive_weight, mse_weight, distill_weight: ``w_c``, ``w_m``, ``w_r``.
        documents: ``(N, d)`` teacher embeddings of the corpus that ``L_rank`` ranks (needed when ``w_r`` > 0).
        distill_temperature: ``tau_r``."""

    def __init__(self, temperature: float = 0.05, contrastive_weight: float = 1.0,
                 mse_weight: float = 1.0, *, documents: Tensor | None = None, distill_weight: float = 0.0,
                 distill_temperature: float = 0.05) -> None:
        super().__init__()
        if min(contrastive_weight, mse_weight, distill_weight) < 0 or \
                contrastive_weight + mse_weight + distill_weight == 0:
            raise ConfigError("contrastive_weight, mse_weight and distill_weight must be >= 0 and not all 0")
        if distill_weight > 0 and (documents is None or documents.dim() != 2 or not len(documents)):
            raise ConfigError("distill_weight > 0 needs documents, the (N, d) teacher embeddings of the "
                              "corpus")
        if distill_temperature <= 0:
            raise ConfigError(f"distill_temperature must be > 0, got {distill_temperature}")
        self.contrastive = AsymInfoNCELoss(temperature)
        self.mse = NormalizedMSELoss()
        self.contrastive_weight = contrastive_weight
        self.mse_weight = mse_weight
        self.distill_weight = distill_weight
        self.distill_temperature = distill_temperature
        self.documents = F.normalize(documents.float(), dim=-1) if distill_weight > 0 else None

    def rank_kl(self, student: Tensor, teacher: Tensor) -> Tensor:
        """``L_rank`` (unweighted), in float32."""
        docs = self.documents.to(student.device)
        self.documents = docs  # moved once, kept on the student's device
        tau = self.distill_temperature
        with torch.autocast(device_type=student.device.type, enabled=False):  # float32 (see fp32_cosines);
            log_s = F.log_softmax(F.normalize(student.float(), dim=-1) @ docs.T / tau, dim=-1)  # docs are
            log_t = F.log_softmax(F.normalize(teacher.float(), dim=-1) @ docs.T / tau, dim=-1)  # normalised once
        return F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")

    def forward(self, student: Tensor, teacher: Tensor) -> dict[str, Tensor]:
        parts: dict[str, Tensor] = {}
        if self.contrastive_weight:
            parts["asym_infonce"] = self.contrastive_weight * self.contrastive(student, teacher)["asym_infonce"]
        if self.mse_weight:
            parts["mse"] = self.mse_weight * self.mse(student, teacher)["mse"]
        if self.distill_weight:
            parts["rank_kl"] = self.distill_weight * self.rank_kl(student, teacher)
        return parts
