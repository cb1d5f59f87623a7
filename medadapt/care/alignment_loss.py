"""Stage-I query-alignment objective of CARE (§4.2.1, eq. 2 and eq. 3).

    L_MSE   = 1/B sum_i || E_Q(x_i)/|E_Q(x_i)| - E_D(x_i)/|E_D(x_i)| ||^2          (eq. 2)
    L_align = w_c * L_AsymInfoNCE + w_m * L_MSE                                      (eq. 3)

The student is the query tower ``E_Q``, the teacher the frozen document tower ``E_D``, and ``x_i`` the same
unlabeled text on both sides (self-contrastive). The paper states eq. 3 as a weighted sum with one weight
``lambda`` on the MSE term whose value is not given; here both weights are named and configurable
(``contrastive_weight``, ``mse_weight``; 1 and 1 by default), so the Table-4 ablations "w/o MSE" and
"w/o Contrastive" are ``mse_weight=0`` and ``contrastive_weight=0``.

Optional ranking distillation (not in the paper, ``distill_weight`` > 0, with a ``documents`` table):

    L_rank  = 1/B sum_i KL( softmax(t_i D^T / tau_r) || softmax(s_i D^T / tau_r) )

``t_i``, ``s_i`` the normalised teacher and student embeddings of ``x_i``, ``D`` the frozen document tower's
normalised embeddings of the corpus (``(N, d)``, from the cache). Eq. 2 pulls the student towards the
teacher in every direction alike; ``L_rank`` asks only that the student *rank the corpus* as the teacher
does, which is what retrieval reads. On MedQuAD's held-out MPlus questions (short topic questions) a
1-layer MiniLM tower trained with eq. 3 kept 90.0% of the document model's nDCG@10, with ``L_rank`` 99.3%
(docs/benchmarks.md, leave-one-source-out). The softmax over all of ``D`` is exact (no sampling), so the
table's size bounds the cost: a ``(B, N)`` product per step, N ~14k documents of 384 dimensions on MedQuAD.
Hand-written for the same reason as eq. 2: sentence-transformers' distillation losses score given pairs,
not precomputed teacher embeddings against a whole corpus.

``L_MSE`` is the squared L2 distance between unit vectors summed over dimensions (``2 - 2 cos``), averaged
over the batch: on the same scale for any embedding width, unlike ``torch.nn.MSELoss``'s mean over
elements, which divides by the dimension. Hand-written: no library ships this pair of losses on
precomputed teacher embeddings.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.losses.asym_infonce import AsymInfoNCELoss

__all__ = ["NormalizedMSELoss", "QueryAlignmentLoss"]


class NormalizedMSELoss(nn.Module):
    """Eq. 2: ``{"mse": mean_i ||norm(student_i) - norm(teacher_i)||^2}``.

    Inputs: ``student`` and ``teacher``, both ``(B, d)``.
    """

    def forward(self, student: Tensor, teacher: Tensor) -> dict[str, Tensor]:
        if student.shape != teacher.shape or student.dim() != 2:
            raise ValueError(f"student and teacher must be (B, d); got {tuple(student.shape)}, "
                             f"{tuple(teacher.shape)}")
        diff = F.normalize(student.float(), dim=-1) - F.normalize(teacher.float(), dim=-1)
        return {"mse": diff.pow(2).sum(dim=-1).mean()}


class QueryAlignmentLoss(nn.Module):
    """Eq. 3: weighted Asym-InfoNCE (eq. 1) + normalised MSE (eq. 2), plus the optional ranking
    distillation ``L_rank`` (module docstring); returns the *weighted* parts
    ``{"asym_infonce": w_c * L1, "mse": w_m * L2, "rank_kl": w_r * L_rank}`` (a zero-weight part is left out).

    Args:
        temperature: Asym-InfoNCE temperature.
        contrastive_weight: ``w_c`` (0 disables the contrastive term: ablation "w/o Contrastive").
        mse_weight: ``w_m`` (0 disables the MSE term: ablation "w/o MSE").
        documents: ``(N, d)`` teacher embeddings of the corpus that ``L_rank`` ranks (normalised here).
        distill_weight: ``w_r``; > 0 needs ``documents``.
        distill_temperature: ``tau_r``.

    Example:
        >>> loss = QueryAlignmentLoss(temperature=0.05, mse_weight=1.0)
        >>> parts = loss(query_tower(texts), teacher_embeddings)      # teacher from the EmbeddingCache
        >>> sum(parts.values()).backward()
    """

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
        """``L_rank`` (unweighted): batch-mean KL from the teacher's to the student's softmax over the
        corpus."""
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
