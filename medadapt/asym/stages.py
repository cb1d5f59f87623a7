"""The three CARE training phases on a Router-based asymmetric model (CARE §4.2, Appendix C).

* :func:`init_tower` – **independent initialisation** (Appendix C.1): symmetric InfoNCE fine-tuning of one
  standalone tower on (query, positive, hard negatives); for the document tower wrap the loss in
  :class:`~medadapt.losses.MatryoshkaLoss` (eq. 5) so its prefix is usable at the query width.
* :func:`align_queries` – **stage I** (§4.2.1): document tower frozen; the query route learns to map each
  unlabeled text onto the teacher's embedding of the same text (eq. 3 = Asym-InfoNCE eq. 1 + MSE eq. 2).
  Teacher embeddings are a precomputed tensor (from the EmbeddingCache), so the large model never runs.
* :func:`joint_finetune` – **stage II** (§4.2.2): query route and document route (through LoRA when
  attached) trained together with Asym-InfoNCE (eq. 4) over in-batch and hard negatives, one learning rate.
  ``train_document=False`` keeps the document tower frozen and reads document embeddings from a table
  (the CPU shortcut: the cached corpus stays valid).

Every phase runs on :func:`~medadapt.asym.loop.run_stage` (Accelerate, resumable checkpoints). Under several
processes each step embeds its shard of the global batch, then all-gathers query, positive, negative and
teacher embeddings (:func:`~medadapt.training.distributed.gather_with_grad`), so in-batch negatives span the
global batch and the loss equals the single-process one (see :mod:`medadapt.asym.loop`). Texts are
routed by ``task`` through the model's Router (``model.preprocess(texts, task="query")``), exactly what
``encode_query`` / ``encode_document`` do at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from medadapt.asym.alignment_loss import QueryAlignmentLoss
from medadapt.asym.data import TrainPair
from medadapt.asym.loop import LoopConfig, StageResult, run_stage
from medadapt.asym.model import route_modules
from medadapt.errors import ConfigError
from medadapt.losses.asym_infonce import AsymInfoNCELoss
from medadapt.training.distributed import gather_with_grad

__all__ = ["align_queries", "embed", "init_tower", "joint_finetune", "route_parameters", "teacher_targets"]


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def embed(model, texts: Sequence[str], task: str | None, *, run_model: nn.Module | None = None,
          max_length: int | None = None) -> Tensor:
    """Embed ``texts`` *with gradients*: ``model.preprocess`` with the task's prompt, then a forward pass
    of ``run_model`` (``model`` or its DDP wrapper). ``task`` picks the Router route and the prompt."""
    prompt = (model.prompts or {}).get(task) if task else None
    kwargs: dict[str, Any] = {"task": task} if task else {}
    if max_length is not None:
        kwargs["max_length"] = max_length
    features = model.preprocess(list(texts), prompt=prompt or None, **kwargs)
    device = _device(model)
    features = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in features.items()}
    return (run_model or model)(features)["sentence_embedding"]


def route_parameters(model, route: str) -> list[nn.Parameter]:
    """All parameters of a route (whatever their ``requires_grad``)."""
    return [p for m in route_modules(model, route) for p in m.parameters()]


def teacher_targets(teacher, items: Sequence[tuple[str, str]], cache, *, dim: int | None = None,
                    batch_size: int = 64, show_progress: bool = False) -> Tensor:
    """Normalised teacher embeddings ``(N, dim)`` of ``[(text, role)]`` through ``cache`` (a document tower
    already cached costs nothing); truncated to the first ``dim`` coordinates (MRL) then re-normalised."""
    import numpy as np

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
    t = torch.from_numpy(out)
    if dim is not None:
        t = t[:, :dim]
    return torch.nn.functional.normalize(t, dim=-1)


def _set_trainable(model: nn.Module, params: Sequence[nn.Parameter]) -> list[tuple[nn.Parameter, bool]]:
    saved = [(p, p.requires_grad) for p in model.parameters()]
    wanted = {id(p) for p in params}
    for p in model.parameters():
        p.requires_grad_(id(p) in wanted)
    return saved


def _restore(saved: list[tuple[nn.Parameter, bool]]) -> None:
    for p, flag in saved:
        p.requires_grad_(flag)


def init_tower(tower, pairs: Sequence[TrainPair], doc_texts: Sequence[str], config: LoopConfig, loss: nn.Module,
               *, max_length: int | None = None, **run_kwargs: Any) -> StageResult:
    """Independent initialisation of one standalone tower (SentenceTransformer): queries with
    ``task="query"``, documents with ``task="document"``, ``loss(q, d+, d-)`` (InfoNCE, or MRL-wrapped)."""
    params = [p for p in tower.parameters() if p.requires_grad]
    n_neg = len(pairs[0].negatives) if pairs else 0

    def step(run_model: nn.Module, idx: list[int]) -> dict[str, Tensor]:
        batch = [pairs[i] for i in idx]
        q = embed(tower, [b.query for b in batch], "query", run_model=run_model, max_length=max_length)
        docs = [doc_texts[b.positive] for b in batch] + [doc_texts[j] for b in batch for j in b.negatives]
        d = embed(tower, docs, "document", run_model=run_model, max_length=max_length)
        neg = gather_with_grad(d[len(batch):].reshape(len(batch), n_neg, -1)) if n_neg else None
        return loss(gather_with_grad(q), gather_with_grad(d[: len(batch)]), neg)

    return run_stage("init", tower, params, len(pairs), step, config, **run_kwargs)


def align_queries(model, texts: Sequence[str], teacher: Tensor, config: LoopConfig,
                  loss: QueryAlignmentLoss | None = None, *, max_length: int | None = None,
                  **run_kwargs: Any) -> StageResult:
    """Stage I: train the query route so that ``E_Q(texts[i])`` matches ``teacher[i]`` (eq. 3).

    Every document-route parameter is frozen for the duration (``requires_grad`` restored afterwards), so
    the document tower's weights are bit-for-bit unchanged.
    """
    if len(texts) != teacher.shape[0]:
        raise ValueError(f"{len(texts)} texts but {teacher.shape[0]} teacher embeddings")
    loss = loss or QueryAlignmentLoss()
    params = route_parameters(model, "query")
    saved = _set_trainable(model, params)
    teacher = teacher.float()

    def step(run_model: nn.Module, idx: list[int]) -> dict[str, Tensor]:
        student = embed(model, [texts[i] for i in idx], "query", run_model=run_model, max_length=max_length)
        return loss(gather_with_grad(student), gather_with_grad(teacher[idx].to(student.device)))

    try:
        return run_stage("stage1", model, params, len(texts), step, config, **run_kwargs)
    finally:
        _restore(saved)


def joint_finetune(model, pairs: Sequence[TrainPair], doc_texts: Sequence[str], config: LoopConfig,
                   loss: AsymInfoNCELoss | None = None, *, train_document: bool = True,
                   doc_table: Tensor | None = None, query_max_length: int | None = None,
                   doc_max_length: int | None = None, **run_kwargs: Any) -> StageResult:
    """Stage II: Asym-InfoNCE (eq. 4) with in-batch + hard negatives, one learning rate for both towers.

    With ``train_document`` the document route trains too: only its LoRA matrices if an adapter is attached
    (:func:`~medadapt.asym.attach_document_lora`), otherwise all of it. Without it, document embeddings are
    rows of ``doc_table`` (``(n_docs, d)``, e.g. the cached corpus), and only the query route trains.
    """
    from medadapt.asym.lora import has_lora

    loss = loss or AsymInfoNCELoss()
    params = route_parameters(model, "query")
    if train_document:
        doc_modules = route_modules(model, "document")
        lora = any(has_lora(m) for m in doc_modules)
        params += [p for m in doc_modules for n, p in m.named_parameters() if not lora or "lora_" in n]
    elif doc_table is None:
        raise ConfigError("joint_finetune(train_document=False) needs doc_table (the frozen document "
                          "embeddings)")
    saved = _set_trainable(model, params)
    n_neg = len(pairs[0].negatives) if pairs else 0

    def step(run_model: nn.Module, idx: list[int]) -> dict[str, Tensor]:
        batch = [pairs[i] for i in idx]
        q = embed(model, [b.query for b in batch], "query", run_model=run_model, max_length=query_max_length)
        doc_idx = [b.positive for b in batch] + [j for b in batch for j in b.negatives]
        if train_document:
            d = embed(model, [doc_texts[j] for j in doc_idx], "document", run_model=run_model,
                      max_length=doc_max_length)
        else:
            d = doc_table[doc_idx].to(q.device)
        neg = gather_with_grad(d[len(batch):].reshape(len(batch), n_neg, -1)) if n_neg else None
        return loss(gather_with_grad(q), gather_with_grad(d[: len(batch)]), neg)

    try:
        return run_stage("stage2", model, params, len(pairs), step, config, **run_kwargs)
    finally:
        _restore(saved)
