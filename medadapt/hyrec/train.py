"""HyReC training loop (§3.2) on Accelerate.

Each step takes ``batch_size`` examples (query, positive, ``n`` hard negatives; ``n`` = the smallest count
in the batch, at most ``negatives``), computes term weights, union logits and dense vectors for queries
and passages, and minimises :class:`~medadapt.losses.HyReCLoss` (InfoNCE with in-batch + hard negatives on
the normalised term vectors and dense vectors, cross-entropy on the union labels). Optimiser steps go
through :func:`medadapt.training.steps.optimizer_step`; checkpoints (trainable weights, optimiser, step)
through :mod:`medadapt.training.checkpoint`, and a re-run resumes from the newest one.

Frozen variant: the sharing backbone's token states come from a
:class:`~medadapt.hyrec.data.SharedStateCache` (computed once) and, when the dense encoder is frozen too,
the pooled dense inputs from ``dense_inputs`` (e.g. the :class:`~medadapt.cache.EmbeddingCache`), so a step
only runs the lexicon encoder and the projectors. With ``train_lexicon_encoder: false`` the lexicon
encoder's states are cached as well and a step only runs the three projectors (the cheapest form: the
lexical branch is a head on a frozen model).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from medadapt.errors import ConfigError
from medadapt.hyrec.data import Example, SharedStateCache, UnionLabelCache
from medadapt.losses.hyrec import HyReCLoss
from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint, load_checkpoint, save_checkpoint
from medadapt.training.steps import optimizer_step

__all__ = ["HyReCTrainConfig", "HyReCTrainResult", "train_hyrec"]

DenseInputs = Callable[[Sequence[str], str], Tensor]


@dataclass
class HyReCTrainConfig:
    """Optimisation settings (paper: lr 5e-5, 5 epochs, batch 64 small / 30 base, 3 hard negatives).

    ``lexical_words``: which words join the tokens in the training-time lexical score (eq. 10 scores terms
    *and* words): ``none`` (tokens only), ``labels`` (words of the labelling tool's BMES labels) or
    ``predicted`` (words of the union head's arg-max labels, as bagged at inference).
    """

    epochs: int = 1
    max_steps: int | None = None
    batch_size: int = 32
    negatives: int = 3
    lr: float = 5e-5
    head_lr: float | None = None
    weight_decay: float = 0.0
    warmup_ratio: float = 0.05
    max_grad_norm: float | None = 1.0
    seed: int = 42
    train_dense_encoder: bool = True
    train_lexicon_encoder: bool = True
    lexical_words: Literal["none", "labels", "predicted"] = "none"
    log_every: int = 10


@dataclass
class HyReCTrainResult:
    steps: int = 0
    seconds: float = 0.0
    loss_history: list[dict[str, float]] = field(default_factory=list)


def _trainable(model, cfg: HyReCTrainConfig) -> tuple[list, list]:
    """``(encoder params, head params)`` that train under ``cfg`` and the model's variant."""
    for p in model.parameters():
        p.requires_grad_(True)
    if model.config.variant == "frozen":
        model.freeze_shared()
        if not cfg.train_dense_encoder:
            for layer in model.dense_layers:
                for p in layer.parameters():
                    p.requires_grad_(False)
        if not cfg.train_lexicon_encoder:
            for p in model.lexicon.parameters():
                p.requires_grad_(False)
    heads = [*model.weight_proj.parameters(), *model.union_proj.parameters(), *model.projector.parameters()]
    head_ids = {id(p) for p in heads}
    enc = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
    return enc, heads


def _batches(n: int, batch_size: int, epochs: int, seed: int) -> list[list[int]]:
    out = []
    for epoch in range(epochs):
        order = list(range(n))
        random.Random(seed + epoch).shuffle(order)
        out += [order[i : i + batch_size] for i in range(0, n - batch_size + 1, batch_size)] or [order]
    return out


def train_hyrec(model, examples: Sequence[Example], cfg: HyReCTrainConfig, loss_fn: HyReCLoss, *,
                accelerator=None, state_cache: SharedStateCache | None = None,
                dense_inputs: DenseInputs | None = None, checkpoint: CheckpointConfig | None = None,
                progress: Callable[[int, int, dict], None] | None = None) -> HyReCTrainResult:
    """Train ``model`` in place; returns steps, seconds and the per-step loss parts."""
    from tqdm.auto import tqdm

    if not examples:
        raise ConfigError("no training examples")
    if state_cache is not None and model.config.variant != "frozen":
        raise ConfigError("a shared-state cache needs the frozen variant "
                          "(the sharing backbone must not train)")
    if cfg.lexical_words != "none" and not model.config.union:
        raise ConfigError(f"lexical_words: {cfg.lexical_words} needs a model with the semantic union "
                          "(HyReCConfig.union); use 'none' without it")
    if dense_inputs is not None and cfg.train_dense_encoder:
        raise ConfigError("precomputed dense inputs need train_dense_encoder: false")
    torch.manual_seed(cfg.seed)
    device = accelerator.device if accelerator is not None else model.device
    model.to(device)
    enc_params, head_params = _trainable(model, cfg)
    groups = [{"params": enc_params, "lr": cfg.lr}, {"params": head_params, "lr": cfg.head_lr or cfg.lr}]
    groups = [g for g in groups if g["params"]]
    optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    batches = _batches(len(examples), min(cfg.batch_size, len(examples)), cfg.epochs, cfg.seed)
    if cfg.max_steps is not None:
        batches = batches[: cfg.max_steps]
    total = len(batches)
    warm = int(cfg.warmup_ratio * total)

    def lr_lambda(step: int) -> float:
        if step < warm:
            return (step + 1) / max(1, warm)
        return max(0.0, (total - step) / max(1, total - warm))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    result = HyReCTrainResult()
    start = 0
    if checkpoint is not None and checkpoint.resume and (last := latest_checkpoint(checkpoint.directory)):
        weights, opt_state, state = load_checkpoint(last)
        with torch.no_grad():
            for n, t in weights.items():
                trainable[n].copy_(t.to(trainable[n].dtype))
        optimizer.load_state_dict(opt_state["optimizer"])
        scheduler.load_state_dict(opt_state["scheduler"])
        start = int(state["step"])
        result.loss_history = list(state.get("loss_history", []))
    want_labels = loss_fn.weights["union"] > 0 or cfg.lexical_words == "labels"
    labels = UnionLabelCache(model, model.config.language) if want_labels else None
    t0 = time.perf_counter()
    model.train()
    _frozen_parts_eval(model, cfg)
    bar = tqdm(total=total, initial=start, desc="training HyReC", unit="step", disable=progress is None)
    for step in range(start, total):
        batch = [examples[i] for i in batches[step]]
        n_neg = min(cfg.negatives, min(len(e.negatives) for e in batch))
        queries = [e.query for e in batch]
        passages = [e.positive for e in batch] + [e.negatives[j] for e in batch for j in range(n_neg)]
        # positives first, then negatives grouped per query: reorder so negatives are (B, n)
        parts = _step_outputs(model, queries, passages, state_cache, dense_inputs, device,
                              cached_lexicon=(not cfg.train_lexicon_encoder
                                              and model.config.variant == "frozen"))
        q, p = parts
        B = len(batch)

        def split(x: Tensor) -> tuple[Tensor, Tensor | None]:
            pos, neg = x[:B], x[B:]
            return pos, (neg.reshape(B, n_neg, -1) if n_neg else None)

        lex = dense = union = None
        ql = pl = None
        if labels is not None:
            ql = labels.labels(queries, "query", q["input_ids"].shape[1]).to(device)
            pl = labels.labels(passages, "document", p["input_ids"].shape[1]).to(device)
        if loss_fn.weights["lexical"] > 0:
            qv, pv = model.compact_term_vectors(_terms(model, q, ql, cfg.lexical_words),
                                                _terms(model, p, pl, cfg.lexical_words))
            lex = (qv, *split(pv))
        if loss_fn.weights["dense"] > 0:
            dense = (q["dense"], *split(p["dense"]))
        if loss_fn.weights["union"] > 0:
            logits = torch.cat([q["union_logits"].reshape(1, -1, 4), p["union_logits"].reshape(1, -1, 4)], 1)
            union = (logits, torch.cat([ql.reshape(1, -1), pl.reshape(1, -1)], 1))
        out = loss_fn(lexical=lex, dense=dense, union=union)
        lr = optimizer_step(out["loss"], optimizer, scheduler, list(trainable.values()), cfg.max_grad_norm,
                            accelerator)
        record = {"step": step + 1, "lr": lr, **{k: float(v.detach()) for k, v in out.items()}}
        result.loss_history.append(record)
        bar.update(1)
        if progress is not None and ((step + 1) % cfg.log_every == 0 or step + 1 == total):
            progress(step + 1, total, record)
        if checkpoint is not None and checkpoint.every_steps and (step + 1) % checkpoint.every_steps == 0:
            _save(checkpoint, step + 1, trainable, optimizer, scheduler, result)
    bar.close()
    if checkpoint is not None and total > start:
        _save(checkpoint, total, trainable, optimizer, scheduler, result)
    model.eval()
    result.steps = total
    result.seconds = time.perf_counter() - t0
    return result


def _terms(model, out: dict[str, Tensor], gold: Tensor | None, source: str) -> tuple[Tensor, Tensor]:
    """``(weights, term_ids)`` of one side for the lexical score: tokens, plus words per ``source``."""
    if source == "none":
        return out["term_weights"], out["input_ids"]
    if source == "labels":
        lab = gold
    else:
        from medadapt.hyrec.labels import IGNORE

        lab = out["union_logits"].detach().argmax(-1).masked_fill(~out["term_mask"], IGNORE)
    return model.bagged_terms(out["term_weights"], out["input_ids"], out["term_mask"], lab)


def _frozen_parts_eval(model, cfg: HyReCTrainConfig) -> None:
    """Frozen parts run in eval mode (no dropout), trainable ones in train mode."""
    if model.config.variant != "frozen":
        return
    model.auto_model.embeddings.eval()
    for layer in model.shared_layers:
        layer.eval()
    if not cfg.train_dense_encoder:
        for layer in model.dense_layers:
            layer.eval()
    if not cfg.train_lexicon_encoder:
        model.lexicon.eval()


def _save(checkpoint, step, trainable, optimizer, scheduler, result) -> None:
    save_checkpoint(checkpoint, step, {n: p.detach() for n, p in trainable.items()},
                    {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                    {"step": step, "loss_history": result.loss_history})


def _step_outputs(model, queries, passages, state_cache, dense_inputs, device, cached_lexicon=False):
    outs = []
    for texts, role in ((queries, "query"), (passages, "document")):
        if state_cache is not None and cached_lexicon and dense_inputs is not None:
            ids, mask, lex = state_cache.lexicon_batch(model, texts, role)
            ids, mask = ids.to(device), mask.to(device)
            weights, union = model.heads_from_lexicon(lex.to(device), ids, mask)
            tmask = model.term_mask(ids, mask)
            outs.append({"term_weights": weights * tmask.to(weights.dtype), "union_logits": union,
                         "term_mask": tmask, "input_ids": ids,
                         "dense": model.dense_from_pooled(dense_inputs(texts, role).to(device))})
            continue
        if state_cache is not None:
            ids, mask, states = state_cache.batch(model, texts, role)
            feats = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
            states = states.to(device)
        else:
            feats = {k: v.to(device) for k, v in model.tokenize(texts, role).items()}
            states = None
        out = model(feats, states=states, with_dense=dense_inputs is None)
        if dense_inputs is not None:
            out["dense"] = model.dense_from_pooled(dense_inputs(texts, role).to(device))
        outs.append(out)
    return outs
