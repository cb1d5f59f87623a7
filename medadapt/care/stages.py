"""The Steps and Stages of CARE's phases on a Router-based asymmetric model (CARE §4.2, Appendix C): independent
initialisation of one tower (:func:`init_stage`, :func:`unsupervised_stage`), stage I query alignment to the
teacher's precomputed embeddings (:func:`align_stage`, eq. 3) and stage II joint fine-tuning (:func:`joint_stage`,
eq. 4). Texts are routed by ``task`` through the Router; in-batch negatives span the gathered global batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from medadapt.care.alignment_loss import QueryAlignmentLoss
from medadapt.care.data import TrainPair
from medadapt.care.model import route_modules
from medadapt.care.sections import CarePhaseSection
from medadapt.errors import ConfigError
from medadapt.losses.asym_infonce import AsymInfoNCELoss
from medadapt.training.config import OptimSection
from medadapt.training.loop import Batch, LoopResult, Stage, train
from medadapt.training.lora import has_lora
from medadapt.training.steps import TextPairStep, TowerWithLoss, embed, trainable_only

__all__ = ["AlignReplay", "AlignStep", "CarePhaseSection", "PairStep", "TextPairStep", "TowerWithLoss",
           "align_queries", "align_stage", "embed", "init_stage", "init_tower", "joint_finetune",
           "joint_stage", "route_parameters", "teacher_targets", "trainable_only", "unsupervised_stage"]


def route_parameters(model, route: str) -> list[nn.Parameter]:
    """All parameters of a route (whatever their ``requires_grad``)."""
    return [p for m in route_modules(model, route) for p in m.parameters()]


def teacher_targets(teacher, items: Sequence[tuple[str, str]], cache, *, dim: int | None = None,
                    batch_size: int = 64, show_progress: bool = False) -> Tensor:
    """Normalised teacher embeddings ``(N, dim)`` of ``[(text, role)]`` through ``cache``, truncated to the first
    ``dim`` coordinates (MRL) and re-normalised."""
    out: np.ndarray | None = None
    for role in ("query", "document"):
        rows = [i for i, (_, r) in enumerate(items) if r == role]
        if not rows:
            continue
        emb = cache.encode(teacher, [items[i][0] for i in rows], role=role, batch_size=batch_size,
                           show_progress=show_progress, desc=f"teacher ({role})")
        if out is None:
            out = np.zeros((len(items), emb.shape[1]), dtype=np.float32)
        out[rows] = emb
    if out is None:
        raise ConfigError("no teacher texts")
    return torch.nn.functional.normalize(torch.from_numpy(out)[:, :dim], dim=-1)


# ------------------------------------------------------------------------------------------------ steps
@dataclass
class AlignReplay:
    """Stage I's alignment (eq. 3) kept on during stage II, weighted by ``weight``: pair ``i`` of epoch ``e``
    also aligns ``texts[perm_e[i % len(texts)]]`` to its ``teacher`` row (``perm_e`` seeded by ``(seed, e)``:
    the same for any number of processes or chunks and on resume). Not in the paper: a rehearsal-like
    regulariser that keeps a small query tower in the document tower's space (docs/benchmarks.md)."""

    texts: Sequence[str]
    teacher: Tensor
    loss: nn.Module
    weight: float
    max_length: int | None = None
    _perms: dict[tuple[int, int], Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if len(self.texts) != self.teacher.shape[0] or not len(self.texts):
            raise ValueError(f"{len(self.texts)} replay texts but {self.teacher.shape[0]} teacher embeddings")
        if self.weight <= 0:
            raise ValueError(f"replay weight must be > 0, got {self.weight}")

    def rows(self, indices: Sequence[int], seed: int, epoch: int) -> list[int]:
        """The replay texts of items ``indices`` in ``epoch``."""
        key = (seed, epoch)
        if key not in self._perms:
            self._perms.clear()
            g = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 17)
            self._perms[key] = torch.randperm(len(self.texts), generator=g)
        perm = self._perms[key]
        return [int(perm[i % len(self.texts)]) for i in indices]


class PairStep:
    """(query, positive, hard negatives) items -> ``loss(query, positive, negatives)``; documents go through
    the document route, or are rows of ``doc_table``."""

    def __init__(self, model, pairs: Sequence[TrainPair], doc_texts: Sequence[str], loss: nn.Module, *,
                 doc_table: Tensor | None = None, query_max_length: int | None = None,
                 doc_max_length: int | None = None, align: AlignReplay | None = None) -> None:
        self.model, self.pairs, self.doc_texts, self.loss_fn = model, pairs, doc_texts, loss
        self.doc_table, self.align = doc_table, align
        self.query_max_length, self.doc_max_length = query_max_length, doc_max_length
        self.n_neg = len(pairs[0].negatives) if pairs else 0
        if any(len(p.negatives) != self.n_neg for p in pairs):
            raise ConfigError("every training pair needs the same number of hard negatives")

    def forward(self, run_model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        items = [self.pairs[i] for i in batch.indices]
        q = embed(self.model, [b.query for b in items], "query", run_model=run_model,
                  max_length=self.query_max_length)
        doc_idx = [b.positive for b in items] + [j for b in items for j in b.negatives]
        if self.doc_table is None:
            d = embed(self.model, [self.doc_texts[j] for j in doc_idx], "document", run_model=run_model,
                      max_length=self.doc_max_length)
        else:
            d = self.doc_table[doc_idx].to(q.device)
        out = {"query": q, "positive": d[: len(items)]}
        if self.n_neg:
            out["negatives"] = d[len(items):].reshape(len(items), self.n_neg, -1)
        if self.align is not None:
            rows = self.align.rows(batch.indices, batch.seed, batch.epoch)
            out["align_student"] = embed(self.model, [self.align.texts[r] for r in rows], "query",
                                         run_model=run_model, max_length=self.align.max_length)
            out["align_teacher"] = self.align.teacher[rows].to(q.device)
        return out

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        parts = self.loss_fn(outputs["query"], outputs["positive"], outputs.get("negatives"))
        if self.align is not None:
            w = self.align.weight
            for name, value in self.align.loss(outputs["align_student"], outputs["align_teacher"]).items():
                parts[f"align_{name}"] = w * value
        return parts


class AlignStep:
    """Stage I: the query route's embedding of each text (``student``) against the teacher's row (eq. 3)."""

    def __init__(self, model, texts: Sequence[str], teacher: Tensor, loss: nn.Module, *,
                 max_length: int | None = None) -> None:
        self.model, self.texts, self.teacher, self.loss_fn = model, texts, teacher.float(), loss
        self.max_length = max_length

    def forward(self, run_model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        student = embed(self.model, [self.texts[i] for i in batch.indices], "query", run_model=run_model,
                        max_length=self.max_length)
        return {"student": student, "teacher": self.teacher[batch.indices].to(student.device)}

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        return self.loss_fn(outputs["student"], outputs["teacher"])


# ------------------------------------------------------------------------------------------------ stages
def _check(name: str, n_items: int, params: Sequence[nn.Parameter]) -> None:
    if n_items < 1:
        raise ConfigError(f"CARE phase {name!r}: no training items")
    if not params:
        raise ConfigError(f"CARE phase {name!r}: no trainable parameters")


def init_stage(tower, pairs: Sequence[TrainPair], doc_texts: Sequence[str], section: OptimSection,
               loss: nn.Module, *, max_length: int | None = None, name: str = "init") -> Stage:
    """Independent initialisation of one standalone tower: ``loss(q, d+, d-)`` on its parameters that require
    gradients (only the LoRA matrices when an adapter is attached)."""
    params = [p for p in tower.parameters() if p.requires_grad]
    _check(name, len(pairs), params)
    step = PairStep(tower, pairs, doc_texts, loss, query_max_length=max_length, doc_max_length=max_length)
    return Stage(name, len(pairs), step, params, section)


def unsupervised_stage(tower, pairs: Sequence[tuple[str, str]], section: OptimSection, loss: nn.Module, *,
                       max_length: int | None = None, name: str = "unsupervised") -> tuple[TowerWithLoss, Stage]:
    """``(module, stage)`` of unsupervised contrastive pre-training of one tower (Appendix C.1.1):
    ``loss(E(a), E(b))`` on text pairs; ``module`` is the tower plus the loss's parameters (a temperature)."""
    module = TowerWithLoss(tower, loss)
    params = [p for p in tower.parameters() if p.requires_grad] + [p for p in loss.parameters() if p.requires_grad]
    _check(name, len(pairs), params)
    return module, Stage(name, len(pairs), TextPairStep(tower, pairs, loss, max_length=max_length), params, section)


def align_stage(model, texts: Sequence[str], teacher: Tensor, section: OptimSection,
                loss: nn.Module | None = None, *, max_length: int | None = None, name: str = "stage1") -> Stage:
    """Stage I: the query route learns ``E_Q(texts[i]) ~ teacher[i]`` (eq. 3); run it inside
    :func:`trainable_only` so the document route stays frozen."""
    if len(texts) != teacher.shape[0]:
        raise ValueError(f"{len(texts)} texts but {teacher.shape[0]} teacher embeddings")
    params = route_parameters(model, "query")
    _check(name, len(texts), params)
    step = AlignStep(model, texts, teacher, loss or QueryAlignmentLoss(), max_length=max_length)
    return Stage(name, len(texts), step, params, section)


def joint_stage(model, pairs: Sequence[TrainPair], doc_texts: Sequence[str], section: OptimSection,
                loss: nn.Module | None = None, *, train_document: bool = True, doc_table: Tensor | None = None,
                query_max_length: int | None = None, doc_max_length: int | None = None,
                align: AlignReplay | None = None, name: str = "stage2") -> Stage:
    """Stage II: Asym-InfoNCE (eq. 4) with in-batch + hard negatives. With ``train_document`` the document route
    trains too (its LoRA matrices if attached), else documents are rows of ``doc_table`` (``(n_docs, d)``).
    ``align`` replays stage I (:class:`AlignReplay`). Run it inside :func:`trainable_only`."""
    params = route_parameters(model, "query")
    if train_document:
        doc_modules = route_modules(model, "document")
        lora = any(has_lora(m) for m in doc_modules)
        params += [p for m in doc_modules for n, p in m.named_parameters() if not lora or "lora_" in n]
        doc_table = None
    elif doc_table is None:
        raise ConfigError("joint_finetune(train_document=False) needs doc_table "
                          "(the frozen document embeddings)")
    _check(name, len(pairs), params)
    step = PairStep(model, pairs, doc_texts, loss or AsymInfoNCELoss(), doc_table=doc_table,
                    query_max_length=query_max_length, doc_max_length=doc_max_length, align=align)
    return Stage(name, len(pairs), step, params, section)


# ------------------------------------------------------------------------------------------------ runners
# Each trains its stage with medadapt.training.loop.train (``train_kwargs``), only the stage's parameters trainable.
def _run(model, stage: Stage, train_kwargs: dict[str, Any]) -> LoopResult:
    with trainable_only(model, stage.params):
        return train(model, [stage], **train_kwargs)


def init_tower(tower, pairs: Sequence[TrainPair], doc_texts: Sequence[str], section: OptimSection,
               loss: nn.Module, *, max_length: int | None = None, **train_kwargs: Any) -> LoopResult:
    """Independent initialisation of one standalone tower (:func:`init_stage`)."""
    return _run(tower, init_stage(tower, pairs, doc_texts, section, loss, max_length=max_length), train_kwargs)


def align_queries(model, texts: Sequence[str], teacher: Tensor, section: OptimSection,
                  loss: QueryAlignmentLoss | None = None, *, max_length: int | None = None,
                  **train_kwargs: Any) -> LoopResult:
    """Stage I (:func:`align_stage`); the document tower's weights stay bit-for-bit unchanged."""
    return _run(model, align_stage(model, texts, teacher, section, loss, max_length=max_length), train_kwargs)


def joint_finetune(model, pairs: Sequence[TrainPair], doc_texts: Sequence[str], section: OptimSection,
                   loss: AsymInfoNCELoss | None = None, *, train_document: bool = True,
                   doc_table: Tensor | None = None, query_max_length: int | None = None,
                   doc_max_length: int | None = None, align: AlignReplay | None = None,
                   **train_kwargs: Any) -> LoopResult:
    """Stage II (:func:`joint_stage`)."""
    stage = joint_stage(model, pairs, doc_texts, section, loss, train_document=train_document,
                        doc_table=doc_table, query_max_length=query_max_length, doc_max_length=doc_max_length,
                        align=align)
    return _run(model, stage, train_kwargs)
