"""HyReC's learned-lexical branch as a composable branch (``branches: [{kind: hyrec_lexical, ...}]``).

Composed onto a trained dense model (a frozen backbone, optionally with medadapt heads such as a MoE
head): the model's encoder is split as HyReC's GLAE does (``model.branch_layers`` / ``lexicon_layers``,
frozen variant), the lexicon encoder and the weight / union projectors are added, and only the branch
trains (lexical InfoNCE + union loss; ``loss.dense_weight`` must be 0: the dense side is the composed
model's and stays as it was trained; ``loss.hybrid_weight > 0`` adds InfoNCE on the fused score
``lexical + loss.hybrid_dense_weight * dense`` with the composed model's cached dense embeddings held
fixed, training the branch on what the dense side misses). The result is a
:class:`~medadapt.hyrec.model.HyReCModel` whose dense side *is* the composed model, so one folder, one
``medadapt eval --mode hybrid``, one Retriever index (dense + learned sparse) and one LangChain retriever
serve it. Its folder is adapter-only (the heads, the branch in ``hyrec/`` and the base model's name)
when ``save.adapter_only`` is set.

On an **asymmetric** model (a CARE recipe's ``branches:``, e.g. ``recipes/care-minilm-query-ft-hybrid.yaml``)
the branch reads the *document* tower: its tokenizer, embeddings and first layers give the token states of
queries and documents alike (a query pays one extra pass through the frozen document tower's first
``L - branch_layers`` layers plus the lexicon layers), and the dense side stays the two towers
(``encode_query``: the query tower; ``encode_document``: the unchanged document tower, whose cached
embeddings and any document index stay valid). The document tower must be a BERT-like sentence-transformers
encoder (``Transformer`` with an ``encoder.layer`` stack, pooled by cls or mean); a decoder LLM tower is
refused by :func:`check` before anything trains. The folder is the whole asymmetric model, the branch its last
module.
"""

from __future__ import annotations

import time
from typing import Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

import medadapt.hyrec.train as hyrec_train
from medadapt.adapters.compose import base_kind
from medadapt.cache import backbone_view
from medadapt.config import Section
from medadapt.data import BeirDataset, load_beir, merge_beir
from medadapt.domains import fit_domain_classifier
from medadapt.errors import ConfigError
from medadapt.hyrec.data import CachedDenseInputs, SharedStateCache, build_examples, share_miner_encoding
from medadapt.hyrec.evaluate import _STATE_CACHES, evaluate_modes, tune_dense_weight
from medadapt.hyrec.model import HyReCModel
from medadapt.hyrec.sections import (
    HyReCEvalSection,
    HyReCLossSection,
    HyReCModelSection,
    HyReCTrainingSection,
    NegativesSection,
)

__all__ = ["BranchModelSection", "HyReCLexicalBranch", "branch_pooling", "branch_tower", "build_and_train",
           "check", "check_tower", "evaluate"]


class BranchModelSection(HyReCModelSection):
    """HyReC's model section on the composed model's backbone: the frozen variant, backbone unchanged."""

    backbone: str | None = Field(None, description="not used: the branch reads the composed model's backbone")
    variant: Literal["frozen"] = "frozen"
    branch_layers: int = Field(1, ge=1, description="N: the last N layers are the (unchanged) dense encoder")
    lexicon_layers: int | None = Field(1, ge=1, description="lexicon encoder depth (a trainable copy)")
    language: Literal["zh", "en"] = "en"
    pooling: Literal["auto", "cls", "mean"] = Field(
        "auto", description="the dense side's pooling when served in one pass; auto: the backbone's own "
        "Pooling module (mean for MiniLM); anything else must equal it")

    @model_validator(mode="after")
    def _unchanged_backbone(self) -> BranchModelSection:
        if self.extend_vocab or self.num_layers is not None or self.init != "pretrained":
            raise ValueError("a composed branch keeps the backbone unchanged: extend_vocab, num_layers and init "
                             "are not available (train kind: hyrec for those)")
        return self


def _branch_training() -> HyReCTrainingSection:
    return HyReCTrainingSection(state_cache="disk", dense_inputs="cache", train_dense_encoder=False,
                                train_lexicon_encoder=False, lr=1e-3)


class BranchNegativesSection(NegativesSection):
    """Hard negatives for the branch; ``miner: model`` (default) mines with the composed dense model."""

    miner: str = Field("model", description="model: the composed dense model; else a model name")


class BranchEvalSection(HyReCEvalSection):
    """HyReC's evaluation section, plus choosing the fusion weight on a held-out split."""

    tune_dense_weight: list[float] | None = Field(
        None, description="dense_weight values to try after training; the best hybrid nDCG@10 on tune_split "
        "is kept in the saved model (None: keep model.dense_weight)")
    tune_split: str = Field("dev", description="held-out split the weight is chosen on (never the test split)")
    domain_weights: bool = Field(
        False, description="with the recipe's data.mix: choose the weight on each domain's tune_split and fit a "
        "domain classifier that gives every query its domain's weight (HyReCModel.lexical_query_scale)")

    @field_validator("tune_dense_weight")
    @classmethod
    def _weights(cls, v):
        if v is not None and (not v or any(w < 0 for w in v)):
            raise ValueError("tune_dense_weight must list weights >= 0")
        return v

    @model_validator(mode="after")
    def _domain_weights(self) -> BranchEvalSection:
        if self.domain_weights and not (self.tune_dense_weight and all(w > 0 for w in self.tune_dense_weight)):
            raise ValueError("eval.domain_weights chooses a weight per domain from tune_dense_weight: list weights "
                             "> 0 there")
        return self


class HyReCLexicalBranch(Section):
    """A ``branches:`` entry: HyReC's learned-lexical branch beside the composed dense model."""

    kind: Literal["hyrec_lexical"] = "hyrec_lexical"
    model: BranchModelSection = Field(default_factory=BranchModelSection)
    negatives: BranchNegativesSection = Field(default_factory=BranchNegativesSection)
    loss: HyReCLossSection = Field(default_factory=lambda: HyReCLossSection(dense_weight=0.0))
    training: HyReCTrainingSection = Field(default_factory=_branch_training)
    eval: BranchEvalSection = Field(default_factory=lambda: BranchEvalSection(dense_source="cache"))

    @model_validator(mode="after")
    def _branch_only(self) -> HyReCLexicalBranch:
        if self.loss.dense_weight != 0:
            raise ValueError("loss.dense_weight must be 0 in a branch: the dense side is the composed model's "
                             "(train its heads in the recipe's own stages)")
        tr = self.training
        if tr.train_dense_encoder or tr.state_cache == "off" or tr.dense_inputs != "cache":
            raise ValueError("a branch trains on the frozen backbone's caches: training.train_dense_encoder: "
                             "false, state_cache: disk or memory, dense_inputs: cache")
        if self.negatives.refresh_every is not None or tr.batch_size_scope != "global":
            raise ValueError("negatives.refresh_every and training.batch_size_scope are kind: hyrec's: a branch "
                             "mines once with the frozen dense model and its batch_size is global")
        return self


def branch_tower(model) -> tuple[list, str]:
    """``(modules, what)``: the modules of the encoder the branch reads and how errors name it: the model's
    own modules (``"backbone"``), or for an asymmetric model its document route (``"document tower"``)."""
    modules = list(model._modules.values())
    if base_kind(model) == "asymmetric":
        return list(modules[0].sub_modules["document"]), "document tower"
    return modules, "backbone"


def check_tower(model) -> None:
    """Refuse a model whose branch tower (:func:`branch_tower`) is not a BERT-like sentence-transformers
    encoder: a ``Transformer`` first module whose model has an ``encoder.layer`` stack of bidirectional layers
    (GLAE splits it), not a decoder LLM."""
    from sentence_transformers.base.modules import Transformer

    modules, what = branch_tower(model)
    where = " of the asymmetric model" if what == "document tower" else ""
    reason = ("the HyReC lexical branch reads the token states of a BERT-like encoder"
              + ("; on an asymmetric model it reads the document tower for queries and documents alike"
                 if where else ""))
    first = modules[0] if modules else None
    if not isinstance(first, Transformer):
        raise ConfigError(f"cannot compose hyrec_lexical (branch): the {what}{where} starts with "
                          f"{type(first).__name__ if first is not None else 'nothing'}, not a Transformer "
                          f"({reason})")
    auto = first.auto_model
    config = getattr(auto, "config", None)
    layers = getattr(getattr(auto, "encoder", None), "layer", None)
    if layers is None or getattr(config, "is_decoder", False):
        kind = getattr(config, "model_type", type(auto).__name__)
        raise ConfigError(f"cannot compose hyrec_lexical (branch): the {what}{where} is a decoder "
                          f"({kind}, no bidirectional encoder.layer stack) ({reason})")


def branch_pooling(model, requested: str) -> str:
    """The branch's dense pooling: the ``Pooling`` mode of the encoder it reads (the composed model's second
    module; an asymmetric model's document route's). ``auto`` takes it; an explicit value must equal it (a
    branch served in one pass with another pooling would give different dense vectors than the model it was
    composed with)."""
    modules, what = branch_tower(model)
    found = getattr(modules[1], "pooling_mode", None) if len(modules) > 1 else None
    if found not in ("cls", "mean"):
        raise ConfigError(f"a HyReC branch needs a {what} pooled by cls or mean; its second module is "
                          f"{type(modules[1]).__name__ if len(modules) > 1 else 'missing'} "
                          f"(pooling {found!r})")
    if requested not in ("auto", found):
        raise ConfigError(f"branches.hyrec_lexical.model.pooling is {requested!r} but the {what} pools by "
                          f"{found!r}; leave it out (auto) or set {found!r}")
    return found


def build_and_train(model, section: HyReCLexicalBranch, recipe, ctx):
    """Wrap the trained SentenceTransformer ``model`` (one tower, or asymmetric: module docstring) into a
    :class:`~medadapt.hyrec.model.HyReCModel` and train the lexical branch. Returns the composed model."""
    m, tr, neg = section.model, section.training, section.negatives
    check_tower(model)
    config = hyrec_train.model_config(section, pooling=branch_pooling(model, m.pooling))
    t0 = time.perf_counter()
    hy = HyReCModel(model, config).to(ctx.device)
    split = recipe.data.train_split
    domains = mix_domains(recipe, ctx)
    if section.eval.domain_weights and len(domains) < 2:
        raise ConfigError("branches.hyrec_lexical.eval.domain_weights needs the recipe's data.mix (two or more "
                          "domains)")
    splits = [split, section.eval.tune_split] if section.eval.domain_weights else [split]
    parts = {name: load_beir(path, splits) for name, path in domains.items()}  # loaded once, tuned on below
    data = merge_beir(parts) if parts else load_beir(ctx.resolve(recipe.data.path), [split])
    state_cache = SharedStateCache(ctx.cache if tr.state_cache == "disk" else None)
    view = backbone_view(hy.st)
    cache = ctx.cache


    miner = share_miner_encoding(ctx, data, neg.source, neg.num, model if neg.miner == "model" else neg.miner)
    with ctx.accelerator.main_process_first():
        examples = build_examples(data, split, negatives=neg.source if neg.num else "none", window=neg.window,
                                  num_negatives=max(neg.num, 1), max_queries=getattr(recipe.data,
                                                                                     "max_train_queries", None),
                                  miner_model=miner, language=m.language, cache=cache, seed=tr.seed,
                                  show_progress=ctx.show_progress)
        docs = sorted({t for e in examples for t in [e.positive, *e.negatives[: neg.num]]})
        lexicon = not tr.train_lexicon_encoder  # a trained lexicon encoder's states are computed after training
        state_cache.warm(hy, [e.query for e in examples], "query", lexicon=lexicon, pooled=False,
                         show_progress=ctx.show_progress)
        state_cache.warm(hy, docs, "document", lexicon=lexicon, pooled=False, show_progress=ctx.show_progress)
        queries = [e.query for e in examples]
        # the fused-score term (loss.hybrid_weight) scores with the composed model's own dense embeddings, as
        # its index serves them: read from the cache once per role now (unchanged routes from their cached
        # backbone outputs), held fixed while the branch trains
        fixed = (CachedDenseInputs(cache, hy.st, queries, docs).fill(ctx.show_progress)
                 if section.loss.hybrid_weight > 0 else None)
    del miner  # mining is done: a miner loaded here leaves the device before training
    ctx.result.encode_seconds += time.perf_counter() - t0
    ctx.log(f"HyReC lexical branch: {hy._n_shared} shared + {len(hy.lexicon)} lexicon layers on the composed "
            f"model, {len(examples)} examples")
    stage = hyrec_train.hyrec_stage(hy, examples, tr, section.loss, negatives=neg.num, state_cache=state_cache,
                        dense_inputs=CachedDenseInputs(cache, view, queries, docs), fixed_dense=fixed,
                        name="hyrec_lexical", train_dense_head=False)  # read lazily: dense_weight 0 never asks
    res = ctx.train(hy, [stage], name="hyrec_lexical")
    ctx.result.details["branch_steps"] = res.steps
    ctx.result.details["branch_examples"] = len(examples)
    hy.eval()
    ev = section.eval
    if ev.domain_weights:
        _fit_domain_weights(hy, section, parts, split, state_cache, ctx)
    elif ev.tune_dense_weight:
        t0 = time.perf_counter()
        tune_data = load_beir(ctx.resolve(recipe.eval.data or recipe.data.path), [ev.tune_split])
        best, scores = tune_dense_weight(hy, tune_data, ev.tune_split, ev.tune_dense_weight, cache=cache,
                                         state_cache=state_cache, dense_source=ev.dense_source,
                                         batch_size=ev.batch_size, show_progress=ctx.show_progress,
                                         cached_lexicon=True)
        hy.config.dense_weight = best
        ctx.result.details["dense_weight_tuning"] = {"split": ev.tune_split, "chosen": best,
                                                     "ndcg@10": {f"{w:g}": v for w, v in scores.items()},
                                                     "seconds": round(time.perf_counter() - t0, 1)}
        ctx.log(f"HyReC lexical branch: dense_weight {best:g} chosen on {ev.tune_split} "
                f"(nDCG@10 {scores[best]:.4f}; weight 1: {scores.get(1.0, float('nan')):.4f})")
    _STATE_CACHES[hy] = state_cache
    return hy


def mix_domains(recipe, ctx) -> dict[str, str]:
    """Domain name -> resolved BEIR folder of the recipe's ``data.mix`` (a data section with ``mix`` and
    ``domain_paths()``, as ``kind: moe`` has); empty without a mix."""
    paths = getattr(recipe.data, "domain_paths", None)
    if not getattr(recipe.data, "mix", None) or not callable(paths):
        return {}
    return {name: ctx.resolve(path) for name, path in paths().items()}


def _fit_domain_weights(hy: HyReCModel, section: HyReCLexicalBranch, domains: dict[str, BeirDataset],
                        split: str, state_cache, ctx) -> None:
    """``eval.domain_weights``: each domain's dense weight on its own ``tune_split``, then a domain classifier
    (:func:`medadapt.domains.fit_domain_classifier`) on the frozen pooled embeddings of every domain's training
    queries and corpus, read from the run's cache, installed on the branch."""
    ev, t0 = section.eval, time.perf_counter()
    chosen, curves, feats, names = [], {}, [], list(domains)
    view = backbone_view(hy.st)
    for name in names:
        tune_data = domains[name]
        best, scores = tune_dense_weight(hy, tune_data, ev.tune_split, ev.tune_dense_weight, cache=ctx.cache,
                                         state_cache=state_cache, dense_source=ev.dense_source,
                                         batch_size=ev.batch_size, show_progress=ctx.show_progress,
                                         cached_lexicon=True)
        chosen.append(best)
        curves[name] = {f"{w:g}": v for w, v in scores.items()}
        ctx.log(f"HyReC lexical branch: domain {name}: dense_weight {best:g} on {ev.tune_split} "
                f"(nDCG@10 {scores[best]:.4f})")
        feats.append(np.concatenate([
            ctx.cache.encode(view, texts, role=role, normalize=False, batch_size=ev.batch_size, show_progress=False)
            for texts, role in ((list(tune_data.split_queries(split).values()), "query"),
                                (tune_data.doc_texts(), "document"))]))
    weight, bias, accuracy = fit_domain_classifier(feats)
    hy.branch.set_domains(names, chosen, weight, bias)
    ctx.result.details["dense_weight_tuning"] = {
        "split": ev.tune_split, "chosen": dict(zip(names, chosen)), "ndcg@10": curves,
        "classifier_train_accuracy": round(accuracy, 4), "seconds": round(time.perf_counter() - t0, 1)}
    ctx.log("HyReC lexical branch: per-domain fusion weights " + ", ".join(
        f"{n} {w:g}" for n, w in zip(names, chosen)) + f" (domain classifier training accuracy {accuracy:.1%})")


def evaluate(recipe, model, section: HyReCLexicalBranch, ctx) -> dict[str, float]:
    """``<mode>/<metric>`` of the composed model for ``section.eval.modes`` on the recipe's eval split."""
    ev = section.eval.model_copy(update={"split": recipe.eval.split, "metrics": recipe.eval.metrics})
    data = load_beir(ctx.resolve(recipe.eval.data or recipe.data.path), [ev.split])
    state_cache = _STATE_CACHES.get(model)
    modes = evaluate_modes(model, data, ev, cache=ctx.cache, state_cache=state_cache,
                           show_progress=ctx.show_progress, cached_lexicon=state_cache is not None)
    ctx.result.details["mode_metrics"] = modes
    return {f"{mode}/{k}": v for mode, vals in modes.items() for k, v in vals.items()}


def check(model, section: HyReCLexicalBranch, recipe) -> None:
    """Refuse, before any training, a branch that cannot sit on ``model`` (the encoder it reads is not
    BERT-like, or its pooling) or that would choose its fusion weight on the split the run reports."""
    check_tower(model)
    branch_pooling(model, section.model.pooling)
    if section.eval.tune_dense_weight and section.eval.tune_split == recipe.eval.split:
        raise ConfigError(f"branches.hyrec_lexical.eval.tune_split {section.eval.tune_split!r} is the split the "
                          "run reports; choose the fusion weight on a held-out split")
