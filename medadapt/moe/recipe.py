"""The ``moe`` recipe kind: Med-MoE-Embed heads on a frozen backbone, or backbone / LoRA fine-tuning.

A recipe file looks like::

    kind: moe
    name: med-moe-embed
    model:    {backbone: minilm, freeze_backbone: true}
    data:     {path: ../shared/data/medquad, train_split: train, hard_negatives: {window: [3, 30]}}
    head:     {kind: moe, top_k: 2}
    loss:     {kind: infonce, temperature: 0.05, load_balance_weight: 0.01}
    training: {shared_epochs: 2, random_routing_epochs: 1, epochs: 1, batch_size: 128, lr: 1.0e-3}
    eval:     {split: dev, metrics: [ndcg@10, recall@100], expected: {ndcg@10: 0.65}}

:func:`medadapt.recipes.run_recipe` (``medadapt train``) runs it; :func:`train` takes one of two paths,
both checkpointing to ``<output>.checkpoints/`` (a rerun resumes):

* **Fast path** (``model.freeze_backbone: true``, no ``peft``, a ``head``): training queries and corpus
  are encoded once into the embedding cache (main process first), hard negatives are mined on those
  embeddings, and only the head trains, on cached tensors, through the one loop with Med-MoE-Embed's
  two-step schedule (:mod:`medadapt.moe.schedule`). ``head.kind`` is ``moe``, ``linear`` (identity-initialised
  ``W e``, LlamaIndex / Chroma) or ``search_adaptor`` (``e + s W e``, Search-Adaptor); the last two train in
  one stage of ``training.epochs`` (``shared_epochs`` / ``random_routing_epochs`` and an explicit
  ``loss.load_balance_weight`` are refused for them). ``head.route: query`` adapts queries only, on any
  backbone (a one-tower model is split into a Router sharing its backbone): the documents' cached frozen
  embeddings are used as they are in training and evaluation.
* **Slow path** (``freeze_backbone: false`` or a ``peft`` LoRA adapter): one stage of the same loop
  (:mod:`medadapt.moe.backbone`) trains the backbone (or its LoRA matrices) on the texts, the head (if any)
  jointly, with the fast path's InfoNCE at ``loss.temperature`` over in-batch + mined hard negatives (mined
  with the frozen backbone before anything trains); LoRA is merged before saving. It has no stage schedule
  and no load-balancing term, so recipes setting ``shared_epochs``, ``random_routing_epochs`` or a routed
  ``load_balance_weight`` are refused.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, field_validator, model_validator

from medadapt import models as model_io
from medadapt.adapters.compose import base_kind, branch_kind, check_composition
from medadapt.adapters.types import adapter_type_of
from medadapt.config import Section, validate_each
from medadapt.curation.mining_config import MiningConfig
from medadapt.data import domain_of, load_beir, merge_beir
from medadapt.errors import ConfigError
from medadapt.moe.backbone import backbone_stage, text_items
from medadapt.moe.domains import fit_domain_routing
from medadapt.moe.peers import MoEEvalSection, peers_problem, run_peers
from medadapt.moe.schedule import expert_load_log, head_stages, head_training, merge_routing_stats
from medadapt.moe.sections import (
    HeadSection,
    InfoNCESection,
    LossSection,
    MoEHeadSection,
    MoETrainingSection,
    NoHead,
)
from medadapt.plan import LoraSpec, ModelSpec, PhaseSpec, PlanSpec, Usage, find_config
from medadapt.recipes.base import DataSection, LoraSection, RecipeBase
from medadapt.recipes.run import RunContext, evaluate_dense
from medadapt.systems import load_paper
from medadapt.training.lora import attach_lora, merge_lora
from medadapt.training.pairs import pairs_from_qrels, prepare_head_training

__all__ = ["ADAPTER_NAME", "MoEDataSection", "MoEModelSection", "MoERecipe", "train"]

#: the name ``medadapt train`` gives the head it adds (``model.add_adapter(recipe.head, adapter_name=...)``)
ADAPTER_NAME = "default"


class MoEModelSection(Section):
    """The backbone and how it trains: frozen (fast path, a head must train) or fine-tuned (slow path)."""

    backbone: str = Field(..., description="alias (minilm), model folder, or hub id")
    max_seq_length: int | None = Field(None, ge=8)
    freeze_backbone: bool = True
    peft: LoraSection | None = Field(None, description="train a LoRA adapter on the backbone (slow path)")


class MixSection(Section):
    """One more domain trained on together with ``data.path`` (its ``train_split`` qrels and its corpus)."""

    path: str = Field(..., min_length=1, description="BEIR folder or builtin dataset name")
    name: str | None = Field(None, description="domain name (default: the folder's name)")


class MoEDataSection(DataSection):
    """Training pairs from the ``train_split`` qrels of a BEIR folder, with optional mined hard negatives.

    ``mix`` trains one model on several medical domains: their train splits and corpora join ``path``'s
    (:func:`medadapt.data.merge_beir`; hard negatives are mined in the union corpus), and ``balance: domain``
    gives every domain the same number of pairs per epoch (the smaller ones repeated, seeded), so the largest
    set does not decide alone what the head learns. Evaluation stays on ``path`` (``eval.data``); score the
    other domains with ``eval.also``."""

    max_train_queries: int | None = Field(None, ge=1, description="train on the first N queries only")
    hard_negatives: MiningConfig | None = Field(
        None, description="mine hard negatives for each training query with the frozen backbone (dense)")
    mix: list[MixSection] = Field(default_factory=list, description="more domains to train on together")
    balance: Literal["none", "domain"] = Field(
        "none", description="domain: as many pairs per epoch from every domain of a mix (smaller ones repeated)")

    @model_validator(mode="after")
    def _mix_names(self):
        names = [domain_name(self.path)] + [m.name or domain_name(m.path) for m in self.mix]
        if len(set(names)) != len(names):
            raise ValueError(f"data.mix: two domains have the same name ({', '.join(names)}); set mix[].name")
        if self.balance == "domain" and not self.mix:
            raise ValueError("data.balance: domain needs data.mix (one domain is already balanced)")
        return self


def domain_name(path: str) -> str:
    """A data set's domain name in a mix: the folder's (or builtin set's) last path component."""
    return Path(path.rstrip("/")).name or path


class MoERecipe(RecipeBase):
    """A Med-MoE-Embed recipe (``kind: moe``); see the module docstring for the two training paths."""

    kind: Literal["moe"] = "moe"
    model: MoEModelSection
    data: MoEDataSection
    head: HeadSection = Field(default_factory=NoHead)
    loss: LossSection = Field(default_factory=InfoNCESection)
    training: MoETrainingSection = Field(default_factory=MoETrainingSection)
    eval: MoEEvalSection = Field(default_factory=MoEEvalSection)
    branches: list[Any] = Field(default_factory=list, description="branches composed beside the dense "
                                "embedding, e.g. [{kind: hyrec_lexical, ...}] (medadapt.adapters.compose)")

    @field_validator("branches", mode="before")
    @classmethod
    def _branch_sections(cls, value):
        """Each entry validated by its registered branch kind's section (``kind`` picks it)."""

        return validate_each(value or [], lambda entry: branch_kind(str(entry.get("kind"))).section, "branch")

    @property
    def fast(self) -> bool:
        """``True`` when only the head trains, on cached embeddings of the frozen backbone."""
        return self.model.freeze_backbone and self.model.peft is None

    @model_validator(mode="after")
    def _trainable(self) -> MoERecipe:
        problem = recipe_problem(self)
        if problem:
            raise ValueError(problem)
        return self


def _moe_only_problem(recipe: MoERecipe) -> str | None:
    """MoE-only options set for another head kind (``None`` when there are none)."""
    head, t = recipe.head, recipe.training
    if head.kind in ("none", "moe"):
        return None
    bad = [f"training.{name}={getattr(t, name)}" for name in ("shared_epochs", "random_routing_epochs")
           if getattr(t, name)]
    if "load_balance_weight" in recipe.loss.model_fields_set and recipe.loss.load_balance_weight:
        bad.append(f"loss.load_balance_weight={recipe.loss.load_balance_weight}")
    if not bad:
        return None
    return (f"{', '.join(bad)}: MoE-only options (expert stages, load balancing) for head.kind "
            f"{head.kind}, which trains in one stage of training.epochs; remove them or set them to 0")


def _no_epochs_problem(recipe: MoERecipe) -> str | None:
    """A head or backbone that would train for 0 epochs (every stage it has at 0): a no-op run that would
    save the untrained weights as if trained (``None`` when something trains)."""
    head, t = recipe.head, recipe.training
    if recipe.fast and head.kind == "none":
        return None  # only branches train, with their own epochs (or recipe_problem says there are none)
    epochs = t.epochs
    if recipe.fast and isinstance(head, MoEHeadSection):  # the stages moe.schedule runs for this head
        epochs += t.shared_epochs if head.shared_experts else 0
        epochs += t.random_routing_epochs if head.routed_experts else 0
    if epochs:
        return None
    stages = ("training.epochs, training.shared_epochs and training.random_routing_epochs are 0"
              if recipe.fast and isinstance(head, MoEHeadSection) else "training.epochs is 0")
    return (f"{stages}: nothing would train and the untrained {'head' if recipe.fast else 'model'} would be "
            "saved; train at least 1 epoch (to score a model without training, use medadapt eval)")


def recipe_problem(recipe: MoERecipe) -> str | None:
    """Why ``recipe`` cannot train as written (``None`` when it can)."""
    if recipe.branches and not recipe.fast:
        return "branches compose onto a frozen backbone (model.freeze_backbone: true, no model.peft)"
    moe_only = _moe_only_problem(recipe) or peers_problem(recipe) or _no_epochs_problem(recipe)
    if moe_only:
        return moe_only
    if getattr(recipe.head, "domain_routing", False) and not (recipe.fast and recipe.data.mix):
        return ("head.domain_routing chooses a residual scale per domain of data.mix: it needs data.mix and a "
                "head on a frozen backbone (model.freeze_backbone: true, no model.peft)")
    if recipe.fast:
        if recipe.head.kind == "none" and not recipe.branches:
            return ("nothing to train: the backbone is frozen, there is no model.peft adapter and head.kind "
                    "is none")
        return None
    t = recipe.training
    ignored = [f"training.{name}={getattr(t, name)}" for name in ("shared_epochs", "random_routing_epochs")
               if getattr(t, name)]
    routed = isinstance(recipe.head, MoEHeadSection) and bool(recipe.head.routed_experts)
    if routed and recipe.loss.load_balance_weight:
        ignored.append(f"loss.load_balance_weight={recipe.loss.load_balance_weight}")
    if getattr(recipe.head, "drift_weight", 0):
        ignored.append(f"head.drift_weight={recipe.head.drift_weight}")
    if ignored:
        return (f"{', '.join(ignored)}: the backbone / LoRA path has no stage schedule, no load-balancing "
                "term and no drift term (they apply to a head on a frozen backbone); set them to 0")
    return None


def train(recipe: MoERecipe, ctx: RunContext):
    """Train what ``recipe`` describes (fast or slow path, module docstring); returns the
    SentenceTransformer (head attached before ``Normalize``) and fills ``ctx.result``."""

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
        if recipe.head.kind != "none":
            _train_fast(recipe, model, data, ctx)
        ctx.result.adapter_base = recipe.model.backbone
    else:
        _train_slow(recipe, model, data, ctx)
    for section in recipe.branches:  # each branch wraps the model it is given (medadapt.adapters.compose)

        model = branch_kind(section.kind).build_and_train(model, section, recipe, ctx)
    return model


def load_training_data(recipe: MoERecipe, ctx: RunContext):
    """``data.path``'s train split, merged with every ``data.mix`` domain's (ids prefixed ``<domain>/``)."""
    split = recipe.data.train_split
    if not recipe.data.mix:
        return load_beir(ctx.resolve(recipe.data.path), [split])
    parts = {domain_name(recipe.data.path): load_beir(ctx.resolve(recipe.data.path), [split])}
    for m in recipe.data.mix:
        parts[m.name or domain_name(m.path)] = load_beir(ctx.resolve(m.path), [split])
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
    """The head's route and the branches against :data:`medadapt.adapters.compose.ALLOWED`."""

    parts = [(recipe.head.kind, recipe.head.route)] if recipe.head.kind != "none" else []
    parts += [(b.kind, "branch") for b in recipe.branches]
    check_composition(base_kind(model), parts)
    for section in recipe.branches:  # e.g. the branch's pooling against the backbone's, before any training

        kind = branch_kind(section.kind)
        if kind.check is not None:
            kind.check(model, section, recipe)
    if recipe.head.kind != "none" and recipe.head.route != "all" and not recipe.fast:
        raise ConfigError("a head on one route trains on a frozen base (model.freeze_backbone: true, no peft)")


def evaluate(recipe: MoERecipe, model, ctx: RunContext) -> dict[str, float]:
    """:func:`~medadapt.recipes.run.evaluate_dense`, or the last branch's evaluation for a composed model
    (e.g. ``lexical/``, ``dense/``, ``hybrid/`` metrics)."""
    if recipe.branches:

        section = recipe.branches[-1]
        return branch_kind(section.kind).evaluate(recipe, model, section, ctx)
    return evaluate_dense(recipe, model, ctx)


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


def _train_fast(recipe: MoERecipe, model, data, ctx: RunContext) -> None:
    """The head, added with ``model.add_adapter(recipe.head)``, trained on cached embeddings through the
    one loop (:mod:`medadapt.moe.schedule`); the backbone is unchanged, so the run folder holds the head
    alone (``save.adapter_only``)."""
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
    with head_training(head):
        stages = head_stages(head, q.float(), p.float(), None if n is None else n.float(),
                             recipe.training, recipe.loss, route=recipe.head.route)
        res = ctx.train(head, stages)
    merge_routing_stats(head, ctx.accelerator)
    ctx.result.details["stage_steps"] = dict(res.stage_steps)
    if callable(getattr(head, "routing_stats", None)):  # MoE heads; linear heads do not route
        ctx.result.details["routing_stats"] = head.routing_stats()
    ctx.result.details["expert_load"] = expert_load_log(head, stages)  # per step, for `medadapt report`
    if getattr(recipe.head, "domain_routing", False):
        _fit_domain_routing(recipe, model, head, ctx)
    run_peers(recipe, q, p, ctx)  # eval.peers: simpler heads on the same cached rows, scored on the same sets


def _fit_domain_routing(recipe: MoERecipe, model, head, ctx: RunContext) -> None:
    """``head.domain_routing``: a residual scale per ``data.mix`` domain, chosen on its ``dev`` split, and the
    domain classifier (:func:`medadapt.moe.domains.fit_domain_routing`); the choice goes to train_log.json."""
    split = recipe.data.train_split
    paths = {domain_name(recipe.data.path): recipe.data.path}
    paths.update({m.name or domain_name(m.path): m.path for m in recipe.data.mix})
    sets = {name: load_beir(ctx.resolve(path), [split, "dev"]) for name, path in paths.items()}
    routing = fit_domain_routing(model, head, sets, ctx.cache, train_split=split,
                                 grid=recipe.head.domain_scale_grid,
                                 batch_size=recipe.training.encode_batch_size, log=ctx.log)
    ctx.result.details["domain_routing"] = routing.as_dict()


def _train_slow(recipe: MoERecipe, model, data, ctx: RunContext) -> None:
    """The backbone (every weight, or a LoRA adapter's matrices) and the head, if any, trained together on
    the texts through the one loop (:mod:`medadapt.moe.backbone`); the LoRA is merged before saving."""
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
    with head_training(head):  # a MoE head learns its full-strength correction, as on the fast path
        res = ctx.train(model, [backbone_stage(model, items, recipe.training, recipe.loss)])
    merge_routing_stats(head, ctx.accelerator)
    ctx.result.details["stage_steps"] = dict(res.stage_steps)
    if callable(getattr(head, "routing_stats", None)):
        ctx.result.details["routing_stats"] = head.routing_stats()
    merge_lora(model)  # the saved folder loads without PEFT


#: ``medadapt train --paper``: the paper's settings, with where it states each (``paper.yaml`` here).
PAPER = load_paper(Path(__file__).with_name("paper.yaml"))

def plan_spec(recipe: MoERecipe):
    """What ``medadapt plan`` needs (:mod:`medadapt.plan`). Fast path: the frozen backbone encodes the
    corpus into the cache (no gradients) and only the head trains, on cached embeddings (query, positive
    and the mined negatives per example). Slow path: the backbone (or its LoRA) trains on the texts."""

    m, tr = recipe.model, recipe.training
    cfg, _ = find_config(m.backbone, recipe._source)
    seq = m.max_seq_length or min(int(cfg.get("max_position_embeddings") or 512), 512)
    mining = recipe.data.hard_negatives
    texts = 2 + (mining.num_negatives if mining is not None else 0)
    head = 0
    if recipe.head.kind != "none":

        built = adapter_type_of(recipe.head).build(recipe.head, int(cfg["hidden_size"]))
        head = sum(p.numel() for p in built.parameters())
    lora = m.peft and LoraSpec(m.peft.r, m.peft.alpha, m.peft.dropout,
                               tuple(m.peft.target_modules) if m.peft.target_modules else None)
    models = [ModelSpec("backbone", m.backbone, lora=lora or None)]
    if recipe.fast:
        models.append(ModelSpec("head", None, head_params=head))
        uses = (Usage("backbone", texts, seq, trains=False), Usage("head", texts, 1))
        notes = ("the head trains on cached backbone embeddings: activations are a few floats per text",)
    else:
        models[0] = ModelSpec("backbone", m.backbone, lora=lora or None, head_params=head)
        uses, notes = (Usage("backbone", texts, seq),), ()
    epochs = tr.shared_epochs + tr.random_routing_epochs + tr.epochs
    phases = (PhaseSpec(f"training ({epochs} epochs)", tr.batch_size, tr.gradient_accumulation_steps, uses),)
    # the fast path's stages (medadapt.moe.schedule): "shared" has its own optimiser, random and learned
    # routing share one
    moe = recipe.head.kind == "moe"
    shared = bool(moe and recipe.head.shared_experts and tr.shared_epochs)
    rest = bool((moe and recipe.head.routed_experts and tr.random_routing_epochs) or tr.epochs)
    optimizers = int(shared) + int(rest) if recipe.fast else 1
    return PlanSpec(recipe.name, tuple(models), phases, tr.mixed_precision, notes, optimizers=optimizers)
