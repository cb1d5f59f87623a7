"""The ``kind: moe`` recipe's training: one phase as :class:`~medadapt.training.loop.Stage`\\ s of the one loop
(checkpointed to ``<output>.checkpoints/``), then the branches. :func:`head_phase` (frozen backbone, no ``peft``):
queries and corpus are encoded once into the cache, hard negatives mined there, and only the head trains on cached
tensors. :func:`backbone_phase`: the backbone (or its LoRA, merged before saving) trains on the texts with the
head, if any, and the same InfoNCE over in-batch + hard negatives (mined with the frozen backbone first).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from medadapt import models as model_io
from medadapt.adapters.compose import base_kind, branch_kind, check_composition
from medadapt.data import BeirDataset, domain_of, load_beir, merge_beir
from medadapt.errors import ConfigError
from medadapt.moe.domains import fit_domain_routing
from medadapt.moe.peers import run_peers
from medadapt.moe.schedule import expert_load_log, head_stages, head_training, merge_routing_stats
from medadapt.moe.sections import InfoNCESection, MoERecipe, MoETrainingSection, recipe_problem
from medadapt.recipes.run import RunContext, evaluate_dense
from medadapt.training.loop import Stage
from medadapt.training.lora import attach_lora, merge_lora
from medadapt.training.pairs import TrainingPairs, pairs_from_qrels, prepare_head_training
from medadapt.training.steps import TextPairStep

__all__ = ["ADAPTER_NAME", "Phase", "backbone_phase", "backbone_stage", "balanced_pairs", "evaluate",
           "head_phase", "load_training_data", "text_items", "train"]

#: the name ``medadapt train`` gives the head it adds (``model.add_adapter(recipe.head, adapter_name=...)``)
ADAPTER_NAME = "default"


@dataclass
class Phase:
    """One phase: ``module`` trains through ``stages``; ``head``: the recipe's head or ``None``; ``rows``: the
    cached ``(query, positive)`` embeddings of the fast path."""

    module: nn.Module
    head: nn.Module | None
    stages: list[Stage]
    rows: tuple[Tensor, Tensor] | None = None


def train(recipe: MoERecipe, ctx: RunContext):
    """Train what ``recipe`` describes; returns the SentenceTransformer (head before ``Normalize``) and fills
    ``ctx.result``."""
    problem = recipe_problem(recipe)  # again: sections may have been assigned after validation
    if problem:
        raise ConfigError(problem)
    if recipe.data.balance == "domain" and not recipe.fast:
        raise ConfigError("data.balance: domain applies to a head on a frozen backbone (the fast path)")
    data = load_training_data(recipe, ctx)
    model = model_io.load(recipe.model.backbone, device=ctx.device)
    if recipe.model.max_seq_length:
        model.max_seq_length = recipe.model.max_seq_length
    _check_composition(recipe, model)
    if recipe.fast:
        ctx.result.adapter_base = recipe.model.backbone
    if not recipe.fast or recipe.head.kind != "none":
        phase = (head_phase if recipe.fast else backbone_phase)(recipe, model, data, ctx)
        with head_training(phase.head):  # a MoE head learns its full-strength correction (residual scale 1)
            res = ctx.train(phase.module, phase.stages)
        merge_routing_stats(phase.head, ctx.accelerator)
        ctx.result.details["stage_steps"] = dict(res.stage_steps)
        if callable(getattr(phase.head, "routing_stats", None)):  # MoE heads; linear heads do not route
            ctx.result.details["routing_stats"] = phase.head.routing_stats()
        if recipe.fast:
            _after_head(recipe, model, phase, ctx)
        else:
            merge_lora(model)  # the saved folder loads without PEFT
    for section in recipe.branches:  # each branch wraps the model it is given (medadapt.adapters.compose)
        model = branch_kind(section.kind).build_and_train(model, section, recipe, ctx)
    return model


def evaluate(recipe: MoERecipe, model, ctx: RunContext) -> dict[str, float]:
    """:func:`~medadapt.recipes.run.evaluate_dense`, or the last branch's evaluation for a composed model
    (e.g. ``lexical/``, ``dense/``, ``hybrid/`` metrics)."""
    if recipe.branches:
        section = recipe.branches[-1]
        return branch_kind(section.kind).evaluate(recipe, model, section, ctx)
    return evaluate_dense(recipe, model, ctx)


def load_training_data(recipe: MoERecipe, ctx: RunContext) -> BeirDataset:
    """``data.path``'s train split, merged with every ``data.mix`` domain's (ids prefixed ``<domain>/``)."""
    split = recipe.data.train_split
    if not recipe.data.mix:
        return load_beir(ctx.resolve(recipe.data.path), [split])
    parts = {name: load_beir(ctx.resolve(path), [split]) for name, path in recipe.data.domain_paths().items()}
    ctx.log("training on " + ", ".join(f"{name} ({len(d.qrels[split]):,} queries, {len(d.corpus):,} documents)"
                                       for name, d in parts.items()))
    return merge_beir(parts)


def balanced_pairs(prepared, seed: int) -> np.ndarray:
    """Pair indices giving every domain of a mix as many pairs as the largest: each smaller domain's pairs
    repeated whole, then a seeded sample of them for the remainder (every pair appears at least once)."""
    domains = np.array([domain_of(prepared.pairs.query_ids[q]) for q in prepared.pairs.pair_query])
    rng = np.random.default_rng(seed)
    names = sorted(set(domains))
    target = max(int((domains == d).sum()) for d in names)
    out = []
    for d in names:
        idx = np.flatnonzero(domains == d)
        reps, rest = divmod(target, len(idx))
        out += [np.tile(idx, reps), rng.choice(idx, size=rest, replace=False)]
    return np.sort(np.concatenate(out))


def _check_composition(recipe: MoERecipe, model) -> None:
    """The head's route and the branches against :data:`medadapt.adapters.compose.ALLOWED`, then each branch's
    own check of the backbone (e.g. its pooling), before any training."""
    parts = [(recipe.head.kind, recipe.head.route)] if recipe.head.kind != "none" else []
    parts += [(b.kind, "branch") for b in recipe.branches]
    check_composition(base_kind(model), parts)
    for section in recipe.branches:
        kind = branch_kind(section.kind)
        if kind.check is not None:
            kind.check(model, section, recipe)
    if recipe.head.kind != "none" and recipe.head.route != "all" and not recipe.fast:
        raise ConfigError("a head on one route trains on a frozen base (model.freeze_backbone: true, no peft)")


def _prepare(recipe: MoERecipe, model, data, ctx: RunContext):
    """Training pairs, the backbone's cached raw embeddings and the mined hard negatives
    (:func:`~medadapt.training.pairs.prepare_head_training`)."""
    t0 = time.perf_counter()
    ctx.share_encoding(model, data.doc_texts(), batch_size=recipe.training.encode_batch_size)  # >1 process
    with ctx.accelerator.main_process_first():  # the main process encodes into the cache, the others read it
        prepared = prepare_head_training(
            model, data, recipe.data.train_split, ctx.cache, mining=recipe.data.hard_negatives,
            max_queries=recipe.data.max_train_queries, batch_size=recipe.training.encode_batch_size,
            show_progress=ctx.show_progress, log=ctx.log)
    ctx.result.encode_seconds += time.perf_counter() - t0
    return prepared


def head_phase(recipe: MoERecipe, model, data, ctx: RunContext) -> Phase:
    """The head (``model.add_adapter(recipe.head)``) on cached embeddings of the frozen backbone."""
    prepared = _prepare(recipe, model, data, ctx)  # before the head exists: raw backbone embeddings
    head = model.add_adapter(recipe.head, adapter_name=ADAPTER_NAME).to(ctx.accelerator.device)
    q, p, n = prepared.tensors()
    if recipe.data.balance == "domain":
        keep = torch.from_numpy(balanced_pairs(prepared, recipe.training.seed))
        q, p, n = q[keep], p[keep], None if n is None else n[keep]
        ctx.result.details["balanced_pairs"] = len(keep)
    if recipe.data.mix:
        domains = [domain_of(prepared.pairs.query_ids[i]) for i in prepared.pairs.pair_query]
        ctx.result.details["pairs_per_domain"] = {d: domains.count(d) for d in sorted(set(domains))}
    n_params = sum(x.numel() for x in head.parameters())
    ctx.log(f"training {n_params:,}-parameter head on {len(prepared.pairs):,} pairs "
            f"({'with' if n is not None else 'without'} hard negatives) on {ctx.device}")
    stages = head_stages(head, q.float(), p.float(), None if n is None else n.float(), recipe.training,
                         recipe.loss, route=recipe.head.route)
    return Phase(head, head, stages, rows=(q, p))


def _after_head(recipe: MoERecipe, model, phase: Phase, ctx: RunContext) -> None:
    """After the fast path: the per-step expert load (``medadapt report``), ``head.domain_routing`` (a residual
    scale per ``data.mix`` domain, :mod:`medadapt.moe.domains`) and ``eval.peers``."""
    head = phase.head
    ctx.result.details["expert_load"] = expert_load_log(head, phase.stages)
    if getattr(recipe.head, "domain_routing", False):
        split = recipe.data.train_split
        sets = {name: load_beir(ctx.resolve(path), [split, "dev"]) for name, path in recipe.data.domain_paths().items()}
        routing = fit_domain_routing(model, head, sets, ctx.cache, train_split=split,
                                     grid=recipe.head.domain_scale_grid,
                                     batch_size=recipe.training.encode_batch_size, log=ctx.log)
        ctx.result.details["domain_routing"] = routing.as_dict()
    run_peers(recipe, *phase.rows, ctx)


def text_items(data: BeirDataset, pairs: TrainingPairs, negatives: np.ndarray | None) -> list[tuple[str, ...]]:
    """One ``(query, positive, negative_1, ..., negative_k)`` tuple of texts per training pair (``negatives``:
    document indices per distinct query, or ``None`` for in-batch negatives only)."""
    texts = data.doc_texts()
    items = []
    for q, d in zip(pairs.pair_query, pairs.pair_doc):
        negs = () if negatives is None else tuple(texts[j] for j in negatives[q])
        items.append((data.queries[pairs.query_ids[q]], texts[d], *negs))
    return items


def backbone_stage(model, items: Sequence[tuple[str, ...]], training: MoETrainingSection,
                   loss: InfoNCESection) -> Stage:
    """The stage ``train``: every parameter of ``model`` that requires gradients on ``items`` (:func:`text_items`)
    through :class:`~medadapt.training.steps.TextPairStep` with InfoNCE at ``loss.temperature``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("the backbone / LoRA path has no trainable parameters")
    if not items:
        raise ConfigError("no training pairs")
    infonce, _ = loss.build()
    step = TextPairStep(model, items, infonce, tasks=("query", "document"))
    return Stage("train", len(items), step, params, training.optim(training.epochs))


def backbone_phase(recipe: MoERecipe, model, data, ctx: RunContext) -> Phase:
    """The backbone (every weight, or a LoRA adapter's matrices) and the head, if any, on the texts."""
    if recipe.data.hard_negatives is not None:  # mined on the frozen backbone's embeddings, before training
        prepared = _prepare(recipe, model, data, ctx)
        pairs, negatives = prepared.pairs, prepared.negatives
    else:
        pairs, negatives = pairs_from_qrels(data, recipe.data.train_split, recipe.data.max_train_queries), None
    if recipe.model.peft is not None:
        attach_lora(model, recipe.model.peft)  # only the LoRA matrices of the backbone train
    head = None
    if recipe.head.kind != "none":
        head = model.add_adapter(recipe.head, adapter_name=ADAPTER_NAME).to(ctx.accelerator.device)
    items = text_items(data, pairs, negatives)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ctx.log(f"training {n_params:,} parameters ({'LoRA' if recipe.model.peft else 'backbone'}"
            f"{' and head' if head is not None else ''}) on {len(items):,} pairs "
            f"({'with' if negatives is not None else 'without'} hard negatives) on {ctx.device}")
    return Phase(model, head, [backbone_stage(model, items, recipe.training, recipe.loss)])
