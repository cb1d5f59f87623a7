"""HyReC training (§3.2) on the one training loop, and the ``kind: hyrec`` recipe's run.

Each item is one :class:`~medadapt.hyrec.data.Example` (query, positive, hard negatives): :class:`HyReCStep`
encodes it, :meth:`HyReCStep.loss` computes :class:`~medadapt.losses.HyReCLoss` on the gathered step. The
frozen variant reads cached states (:class:`~medadapt.hyrec.data.SharedStateCache`, ``dense_inputs``).
:func:`pretrain_stage` is RetroMAE pre-training (§4.1.3, Appendix A; :mod:`medadapt.training.retromae`) as
the first stage of the same loop; :func:`refreshed_stages` cuts a stage into self-mining rounds. A recipe's
:func:`train` runs the paper's three stages (Appendix A) in one loop, resumable across every boundary:
:func:`pretrain_phase` -> :func:`prefinetune_phase` -> :func:`finetune_phase`.

Example:
    >>> res = train_hyrec(model, examples, HyReCTrainingSection(epochs=2, lr=1e-4), HyReCLossSection())
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

import medadapt.training.loop as training_loop
from medadapt.cache import backbone_view
from medadapt.data import load_beir
from medadapt.data.beir import BeirDataset
from medadapt.data.jsonl import field, iter_jsonl
from medadapt.errors import ConfigError, DataError
from medadapt.hyrec.data import (
    CachedDenseInputs,
    Example,
    SharedStateCache,
    UnionLabelCache,
    build_examples,
    filter_pairs,
    load_pairs,
    remine_negatives,
    score_pairs,
    share_miner_encoding,
)
from medadapt.hyrec.evaluate import _STATE_CACHES
from medadapt.hyrec.labels import IGNORE
from medadapt.hyrec.model import HyReCConfig, HyReCModel
from medadapt.hyrec.sections import (
    HyReCLossSection,
    HyReCRecipe,
    HyReCTrainingSection,
    PrefinetuneSection,
    PretrainSection,
)
from medadapt.io import atomic_write_json
from medadapt.losses.hyrec import HyReCLoss
from medadapt.models import load
from medadapt.training.checkpoint import CheckpointConfig
from medadapt.training.loop import Batch, LoopResult, Stage
from medadapt.training.retromae import RetroMAEPretrainer, RetroMAESection, RetroMAEStep

__all__ = ["HyReCPretraining", "HyReCStep", "RunInputs", "copy_lexicon_from_dense", "finetune_phase",
           "hyrec_stage", "model_config", "prefinetune_phase", "prepare_run", "pretrain_phase", "pretrain_stage",
           "refreshed_stages", "train", "train_hyrec"]

DenseInputs = Callable[[Sequence[str], str], Tensor]


def _frozen_modules(model, training: HyReCTrainingSection) -> list:
    """What does not train: in the frozen variant the sharing backbone (embeddings + shared layers), plus
    the dense layers / the lexicon encoder without ``train_dense_encoder`` / ``train_lexicon_encoder``."""
    if model.config.variant != "frozen":
        return []
    frozen = [model.auto_model.embeddings, *model.shared_layers]
    if not training.train_dense_encoder:
        frozen += model.dense_layers
    if not training.train_lexicon_encoder:
        frozen.append(model.lexicon)
    return frozen


def _pad(x: Tensor, length: int, value: float | int = 0) -> Tensor:
    """Pad dim 1 of ``x`` to ``length`` with ``value``."""
    if x.shape[1] >= length:
        return x
    fill = x.new_full((x.shape[0], length - x.shape[1], *x.shape[2:]), value)
    return torch.cat([x, fill], 1)


class HyReCStep:
    """The HyReC objective as a :class:`~medadapt.training.loop.Step` over ``examples``.

    Args:
        model: the :class:`~medadapt.hyrec.model.HyReCModel` (for tokenising, bagging, word ids).
        examples: the training examples; item ``i`` of a batch is ``examples[i]``.
        loss_fn: :class:`~medadapt.losses.HyReCLoss`.
        negatives: hard negatives per example (at most; fewer when an example of the step has fewer).
        lexical_words: words in the training-time lexical score: ``none``, ``labels`` or ``predicted``.
        state_cache / dense_inputs / cached_lexicon: the frozen variant's fast paths (module docstring).
        fixed_dense: the fused-score term's dense vectors (``loss_fn.weights["hybrid"] > 0``) from outside the
            model, e.g. a trained dense model's cached embeddings beside a lexical branch: ``(texts, role) ->
            (n, D)``, no gradient. ``None``: the model's own dense vectors.
    """

    def __init__(self, model, examples: Sequence[Example], loss_fn: HyReCLoss, *, negatives: int = 3,
                 lexical_words: str = "predicted", state_cache: SharedStateCache | None = None,
                 dense_inputs: DenseInputs | None = None, cached_lexicon: bool = False,
                 fixed_dense: DenseInputs | None = None):
        self.model, self.examples, self.loss_fn, self.negatives = model, list(examples), loss_fn, negatives
        self.lexical_words, self.state_cache, self.dense_inputs = lexical_words, state_cache, dense_inputs
        self.cached_lexicon, self.fixed_dense = cached_lexicon, fixed_dense
        w = loss_fn.weights
        self.need_fixed = w["hybrid"] > 0 and fixed_dense is not None
        self.need_dense = w["dense"] > 0 or (w["hybrid"] > 0 and fixed_dense is None)
        self.use_lex = w["lexical"] > 0 or w["hybrid"] > 0
        self.need_union = w["union"] > 0 or (self.use_lex and lexical_words == "predicted")
        want_labels = w["union"] > 0 or (self.use_lex and lexical_words == "labels")
        self.labels = UnionLabelCache(model, model.config.language) if want_labels else None
        self._memo: tuple[tuple, dict[str, Any]] | None = None

    def _step_texts(self, batch: Batch) -> dict[str, Any]:
        """Texts of the whole optimiser step (every process, every chunk), their common token lengths and
        each item's row; computed once per step."""
        key = (batch.step, tuple(batch.all_indices))
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        exs = [self.examples[i] for i in batch.all_indices]
        n_neg = min(self.negatives, min(len(e.negatives) for e in exs))
        queries = [e.query for e in exs]
        passages = [t for e in exs for t in [e.positive, *e.negatives[:n_neg]]]
        info: dict[str, Any] = {"n_neg": n_neg, "row": {i: r for r, i in enumerate(batch.all_indices)},
                                "query": queries, "document": passages}
        for role, texts in (("query", queries), ("document", passages)):
            tok = self.model.tokenize(texts, role)  # one padded length for the step
            info[f"{role}_tokens"] = tok
            info[f"{role}_length"] = tok["input_ids"].shape[1]
        self._memo = (key, info)
        return info

    def forward(self, model, batch: Batch) -> dict[str, Tensor]:
        """Per item: ``q_*`` ``(b, T_q, ...)`` and ``p_*`` ``(b, 1 + n, T_p, ...)`` term weights, ids, term
        mask, union logits / labels (when used) and dense vectors (when used)."""
        info = self._step_texts(batch)
        rows = [info["row"][i] for i in batch.indices]
        per = 1 + info["n_neg"]
        out = {f"q_{k}": v for k, v in self._encode(model, info, "query", rows).items()}
        p_rows = [r * per + j for r in rows for j in range(per)]
        for k, v in self._encode(model, info, "document", p_rows).items():
            out[f"p_{k}"] = v.reshape(len(rows), per, *v.shape[1:])
        return out

    def _encode(self, model, info: dict[str, Any], role: str, rows: list[int]) -> dict[str, Tensor]:
        hy, device = self.model, self.model.device
        texts = [info[role][r] for r in rows]
        length = info[f"{role}_length"]
        pad_id = hy.tokenizer.pad_token_id or 0
        sc = self.state_cache
        with_dense = self.need_dense and self.dense_inputs is None
        if sc is not None and self.cached_lexicon:
            ids, mask, lex = sc.lexicon_batch(hy, texts, role)
            ids, mask = _pad(ids, length, pad_id).to(device), _pad(mask, length).to(device)
            weights, union = hy.heads_from_lexicon(_pad(lex, length).to(device), ids, mask)
            tmask = hy.term_mask(ids, mask)
            o = {"term_weights": weights * tmask.to(weights.dtype), "union_logits": union, "term_mask": tmask,
                 "input_ids": ids}
        elif sc is not None:
            ids, mask, states = sc.batch(hy, texts, role)
            feats = {"input_ids": _pad(ids, length, pad_id).to(device), "attention_mask": _pad(mask, length).to(device)}
            o = model(feats, states=_pad(states, length).to(device), with_dense=with_dense)
        else:
            tok = info[f"{role}_tokens"]
            feats = {k: v[rows].to(device) for k, v in tok.items()}
            o = model(feats, with_dense=with_dense)
        out = {"weights": o["term_weights"], "ids": o["input_ids"], "mask": o["term_mask"]}
        if self.need_union:
            out["union"] = o["union_logits"]
        if self.labels is not None:
            out["labels"] = self.labels.labels(texts, role, length).to(device)
        if self.need_dense:
            out["dense"] = (hy.dense_from_pooled(self.dense_inputs(texts, role).to(device))
                            if self.dense_inputs is not None else o["dense"])
        if self.need_fixed:
            out["fixed"] = self.fixed_dense(texts, role).to(device=device, dtype=torch.float32).detach()
        return out

    def loss(self, out: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        """:class:`~medadapt.losses.HyReCLoss` of the gathered step: ``{"lexical", "dense", "union", "hybrid",
        "loss"}`` (parts with weight 0 left out)."""
        B, per = out["p_weights"].shape[:2]
        w = self.loss_fn.weights
        lex = dense = union = hybrid = None

        def flat(name: str) -> Tensor | None:
            v = out.get(f"p_{name}")
            return None if v is None else v.reshape(B * per, *v.shape[2:])

        def split(x: Tensor) -> tuple[Tensor, Tensor | None]:
            x = x.reshape(B, per, -1)
            return x[:, 0], (x[:, 1:] if per > 1 else None)

        if self.use_lex:
            q_terms = self._terms(out["q_weights"], out["q_ids"], out["q_mask"], out.get("q_union"),
                                  out.get("q_labels"))
            p_terms = self._terms(flat("weights"), flat("ids"), flat("mask"), flat("union"), flat("labels"))
            qv, pv = self.model.compact_term_vectors(q_terms, p_terms)
            lex = (qv, *split(pv))
        if self.need_dense:
            dense = (out["q_dense"], *split(out["p_dense"]))
        if w["hybrid"] > 0:
            hybrid = (lex, (out["q_fixed"], *split(out["p_fixed"])) if self.need_fixed else dense)
        if w["union"] > 0:
            logits = torch.cat([out["q_union"].reshape(1, -1, 4), out["p_union"].reshape(1, -1, 4)], 1)
            labels = torch.cat([out["q_labels"].reshape(1, -1), out["p_labels"].reshape(1, -1)], 1)
            union = (logits, labels)
        return self.loss_fn(lexical=lex if w["lexical"] > 0 else None, dense=dense if w["dense"] > 0 else None,
                            union=union, hybrid=hybrid)

    def _terms(self, weights: Tensor, ids: Tensor, mask: Tensor, union: Tensor | None, gold: Tensor | None
               ) -> tuple[Tensor, Tensor]:
        """``(weights, term_ids)`` of one side's lexical score: tokens (+ words per ``lexical_words``)."""
        if self.lexical_words == "none":
            return weights, ids
        if self.lexical_words == "labels":
            lab = gold
        else:
            lab = union.detach().argmax(-1).masked_fill(~mask.bool(), IGNORE)
        return self.model.bagged_terms(weights, ids, mask.bool(), lab)


def hyrec_stage(model, examples: Sequence[Example], training: HyReCTrainingSection | None = None,
                loss: HyReCLossSection | HyReCLoss | None = None, *, negatives: int = 3,
                state_cache: SharedStateCache | None = None, dense_inputs: DenseInputs | None = None,
                name: str = "hyrec", train_dense_head: bool = True, fixed_dense: DenseInputs | None = None
                ) -> Stage:
    """The :class:`~medadapt.training.loop.Stage` that trains ``model`` on ``examples``: sets which
    parameters train (variant, ``train_dense_encoder``, ``train_lexicon_encoder``), two parameter groups
    (encoders at ``lr``, projectors at ``head_lr``), frozen parts in eval mode when the stage starts.
    ``lexical_words`` counts as ``none`` for a model without the semantic union (``loss.union_weight: 0``).
    ``train_dense_head: false`` keeps the dense head (projector or composed heads) fixed; ``fixed_dense``:
    see :class:`HyReCStep`."""
    training = training if training is not None else HyReCTrainingSection()
    loss_fn = loss if isinstance(loss, HyReCLoss) else (loss or HyReCLossSection()).build()
    if not examples:
        raise ConfigError("no training examples")
    if state_cache is not None and model.config.variant != "frozen":
        raise ConfigError("a shared-state cache needs the frozen variant (the sharing backbone must not train)")
    if dense_inputs is not None and training.train_dense_encoder:
        raise ConfigError("precomputed dense inputs need train_dense_encoder: false")
    cached_lexicon = not training.train_lexicon_encoder and model.config.variant == "frozen"
    if cached_lexicon and (state_cache is None or dense_inputs is None):
        raise ConfigError("train_lexicon_encoder: false needs a shared-state cache and precomputed dense inputs")
    words = training.lexical_words if model.config.union else "none"
    step = HyReCStep(model, examples, loss_fn, negatives=negatives, lexical_words=words, state_cache=state_cache,
                     dense_inputs=dense_inputs, cached_lexicon=cached_lexicon, fixed_dense=fixed_dense)
    frozen = nn.ModuleList(_frozen_modules(model, training) + ([] if train_dense_head else [model.projector]))
    model.requires_grad_(True)
    frozen.requires_grad_(False)  # a view: frozen.eval() also runs them in eval mode
    heads = [*model.weight_proj.parameters(), *model.union_proj.parameters(),
             *(model.projector.parameters() if train_dense_head else [])]
    head_ids = {id(p) for p in heads}
    enc = [p for p in model.parameters() if p.requires_grad and id(p) not in head_ids]
    groups = [{"params": enc, "lr": training.lr}, {"params": heads, "lr": training.head_lr or training.lr}]
    return Stage(name, len(examples), step, [g for g in groups if g["params"]], training,
                 on_start=frozen.eval)


def refreshed_stages(stage: Stage, every: int, refresh: Callable[[int], None], seed: int) -> list[Stage]:
    """``stage`` cut into rounds of ``every`` optimiser steps (ANCE-style self-mining): round ``r > 0`` calls
    ``refresh(r)`` when it starts (also when a resume lands inside it), then ``stage.on_start``. The rounds
    share ``stage``'s optimiser and schedule (one warm-up and decay over all steps) and draw its batches
    from one plan (epoch ``e``: a permutation seeded by ``(seed, e)`` cut into effective batches, the order
    the loop draws for a first stage), so without a refresh they train exactly as that stage does. Round ``r`` is named ``<name>.<r>`` (``r > 0``)."""
    total, eff, n = stage.steps(), stage.optim.effective_batch_size, stage.n_items
    plan: list[list[int]] = []

    def batches(r: int, epoch: int) -> list[list[int]]:
        if epoch:
            return []
        while len(plan) < total:  # drawn once, on first use
            gen = torch.Generator().manual_seed(seed * 1_000_003 + len(plan) // math.ceil(n / eff))
            order = torch.randperm(n, generator=gen).tolist()
            plan.extend(order[b: b + eff] for b in range(0, n, eff))
        return plan[r * every: min((r + 1) * every, total)]

    def start(r: int) -> Callable[[], None]:
        def on_start() -> None:
            refresh(r)
            if stage.on_start is not None:
                stage.on_start()
        return on_start

    return [Stage(stage.name if r == 0 else f"{stage.name}.{r}", n, stage.step, stage.params, stage.optim,
                  schedule=stage.schedule or stage.name, on_start=stage.on_start if r == 0 else start(r),
                  on_end=stage.on_end, batches=lambda e, r=r: batches(r, e))
            for r in range(math.ceil(total / every))]


def train_hyrec(model, examples: Sequence[Example], training: HyReCTrainingSection | None = None,
                loss: HyReCLossSection | HyReCLoss | None = None, *, negatives: int = 3, accelerator=None,
                state_cache: SharedStateCache | None = None, dense_inputs: DenseInputs | None = None,
                checkpoint: CheckpointConfig | None = None, fingerprint: str | None = None,
                progress: Callable[[str, int, int, dict], None] | None = None) -> LoopResult:
    """Train ``model`` in place on ``examples`` (Python API; the recipe runs the same stage through
    ``medadapt train``); returns the loop's :class:`~medadapt.training.loop.LoopResult` (per-step rows with
    ``loss``, ``lexical``, ``dense``, ``union``, ``lr``). The model is left in eval mode."""
    training = training if training is not None else HyReCTrainingSection()
    model.to(accelerator.device if accelerator is not None else model.device)
    stage = hyrec_stage(model, examples, training, loss, negatives=negatives, state_cache=state_cache,
                        dense_inputs=dense_inputs)
    try:
        return training_loop.train(model, [stage], seed=training.seed, accelerator=accelerator,
                                   checkpoint=checkpoint, fingerprint=fingerprint, progress=progress)
    finally:
        model.eval()


# ---------------------------------------------------------------------------------- RetroMAE pre-training
class HyReCPretraining(nn.Module):
    """What the loop trains when a run starts with RetroMAE pre-training: the HyReC model (``hyrec``) and
    RetroMAE's decoder and MLM head (``retromae``, a :class:`~medadapt.training.retromae.RetroMAEPretrainer`
    whose encoder *is* the HyReC model's backbone, so its parameters are held once). Calling it runs the
    HyReC model (the fine-tuning stages' steps call it as they would call the model); ``retromae=True``
    runs the pre-training route. Both routes go through this module's ``forward`` (so an engine wrapping it,
    DeepSpeed or FSDP, would see every forward pass; not yet run on one), and the loop's checkpoints hold the
    decoder and head too, so a run resumed inside the pre-training repeats the uninterrupted one."""

    def __init__(self, hyrec: nn.Module, pretrainer: RetroMAEPretrainer) -> None:
        super().__init__()
        self.hyrec = hyrec
        self.retromae = pretrainer

    def forward(self, *args, retromae: bool = False, **kwargs):
        return self.retromae(*args, **kwargs) if retromae else self.hyrec(*args, **kwargs)


class _RetroMAERoute:
    """The run model as :class:`~medadapt.training.retromae.RetroMAEStep` sees it: calls take the
    pre-training route of :class:`HyReCPretraining` (possibly wrapped by an engine)."""

    def __init__(self, run_model: nn.Module) -> None:
        self.run_model = run_model

    def parameters(self):
        return self.run_model.parameters()

    def __call__(self, *args):
        return self.run_model(*args, retromae=True)


class _PretrainStep:
    """:class:`~medadapt.training.retromae.RetroMAEStep` on the pre-training route of the run model."""

    def __init__(self, step: RetroMAEStep) -> None:
        self.step = step

    def forward(self, run_model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        return self.step.forward(_RetroMAERoute(run_model), batch)

    def loss(self, outputs: dict[str, Tensor], batch: Batch) -> dict[str, Tensor]:
        return self.step.loss(outputs, batch)


@torch.no_grad()
def copy_lexicon_from_dense(model) -> None:
    """Re-initialise the lexicon encoder from the dense encoder's first layers, as
    :meth:`~medadapt.hyrec.model.HyReCModel.from_backbone` does (Appendix A: both branch encoders start
    from the same pre-trained parameters)."""
    for lexicon_layer, dense_layer in zip(model.lexicon, model.dense_layers):
        lexicon_layer.load_state_dict(dense_layer.state_dict())


def pretrain_stage(model, texts: Sequence[str], section: RetroMAESection,
                   training: HyReCTrainingSection | None = None, *, name: str = "pretrain"
                   ) -> tuple[HyReCPretraining, Stage]:
    """``(module, stage)``: RetroMAE masked-autoencoder pre-training (:mod:`medadapt.training.retromae`) of
    the encoder HyReC splits, the backbone's embeddings and its layers (sharing backbone + dense encoder),
    on ``texts``; run it first and train ``module`` (not ``model``) through the loop, with the fine-tuning
    stages after it (they call ``module`` as they would call ``model``). What trains is what the fine-tuning
    trains under ``training`` (the frozen variant keeps the embeddings and the sharing layers fixed; without
    ``train_dense_encoder`` nothing is left: :class:`~medadapt.errors.ConfigError`). When the stage ends
    the lexicon encoder is re-copied from the pre-trained dense layers (:func:`copy_lexicon_from_dense`).
    The decoder and the MLM head are drawn from ``training.seed`` and are not part of the saved model.

    Example:
        >>> module, pre = pretrain_stage(model, texts, PretrainSection(epochs=1), training)
        >>> medadapt.training.loop.train(module, [pre, hyrec_stage(model, examples, training)], seed=training.seed)
    """
    training = training if training is not None else HyReCTrainingSection()
    if not texts:
        raise ConfigError(f"RetroMAE stage {name!r}: no texts")
    if getattr(model, "asymmetric", False):
        raise ConfigError("RetroMAE pre-training needs a HyReC model on one backbone (not an asymmetric dense "
                          "side)")
    frozen = _frozen_modules(model, training)
    frozen_ids = {id(p) for m in frozen for p in m.parameters()}
    parts = [model.auto_model.embeddings, *model.shared_layers, *model.dense_layers]  # not BERT's unused pooler
    encoder = [p for m in parts for p in m.parameters() if id(p) not in frozen_ids]
    if not encoder:
        raise ConfigError("pretrain: nothing to train (the frozen variant keeps the embeddings and the sharing "
                          "layers fixed, and train_dense_encoder is false); drop the pretrain stage or train "
                          "the dense encoder")
    transformer = model.transformer
    with torch.random.fork_rng(devices=[]):  # the decoder and head: the same draw in every run of the recipe
        torch.manual_seed(training.seed)
        pretrainer = RetroMAEPretrainer(model.auto_model)
    step = RetroMAEStep(transformer.tokenizer, list(texts), section,
                        section.max_length or transformer.max_seq_length or 512)
    for m in parts:  # as the fine-tuning stages set them
        for p in m.parameters():
            p.requires_grad_(id(p) not in frozen_ids)
    backbone_ids = {id(p) for p in model.auto_model.parameters()}  # the rest: the decoder and the MLM head
    params = encoder + [p for p in pretrainer.parameters() if id(p) not in backbone_ids]
    frozen_view = nn.ModuleList(frozen)

    return HyReCPretraining(model, pretrainer), Stage(name, len(texts), _PretrainStep(step), params, section,
                                                      on_start=frozen_view.eval,
                                                      on_end=lambda: copy_lexicon_from_dense(model))


# ------------------------------------------------------------------------------- the kind: hyrec run
def model_config(spec, **overrides) -> HyReCConfig:
    """The :class:`~medadapt.hyrec.model.HyReCConfig` of a recipe (or of a section with ``model`` and ``loss``,
    as a branch's): the ``model`` section's architecture fields and ``overrides``, ``union`` iff
    ``loss.union_weight > 0``."""
    fields = {f.name for f in dataclasses.fields(HyReCConfig)}
    settings = {**spec.model.model_dump(include=fields), **overrides}
    return HyReCConfig(**settings, union=spec.loss.union_weight > 0)


@dataclass
class RunInputs:
    """What a recipe's phases train (:func:`prepare_run`); ``None`` for what the recipe does not use."""

    model: HyReCModel
    data: BeirDataset
    examples: list[Example]
    state_cache: SharedStateCache | None
    dense_inputs: DenseInputs | None
    prefinetune_examples: list[Example] | None
    pretrain_texts: list[str] | None


def train(recipe: HyReCRecipe, ctx) -> HyReCModel:
    """Train what a HyReC recipe describes through ``ctx.train``, one loop for every phase (pretrain, then
    prefinetune, then the fine-tuning; each continues from the weights the one before left); returns the
    model. ``ctx.result.details`` gets ``train_examples``, ``n_terms`` and ``steps`` (and ``prefinetune``:
    pairs read / kept, steps; ``pretrain``: texts, steps, first and last loss; ``self_mining``)."""
    run = prepare_run(recipe, ctx)
    stages = [prefinetune_phase(recipe, run, ctx)] if run.prefinetune_examples is not None else []
    stages += finetune_phase(recipe, run, ctx)
    module = run.model
    if run.pretrain_texts is not None:  # RetroMAE first: the loop trains the model plus the decoder and MLM head
        module, stage = pretrain_phase(recipe, run, ctx)
        stages.insert(0, stage)
    res = ctx.train(module, stages)
    details = ctx.result.details
    details["steps"] = res.steps
    if run.prefinetune_examples is not None:
        details["prefinetune"]["steps"] = res.stage_steps.get("prefinetune", 0)
    if run.pretrain_texts is not None:
        rows = [r["loss"] for r in res.loss_history if r.get("stage") == "pretrain"]
        details["pretrain"] = {"texts": len(run.pretrain_texts), "steps": res.stage_steps.get("pretrain", 0),
                               "first_loss": rows[0] if rows else None, "last_loss": rows[-1] if rows else None}
    del module, stages  # the decoder and MLM head are not part of the model
    run.model.eval()
    if run.state_cache is not None:
        _STATE_CACHES[run.model] = run.state_cache
    return run.model


def prepare_run(recipe: HyReCRecipe, ctx) -> RunInputs:
    """Build the model and what the phases train on: the examples with their hard negatives and, as the
    recipe asks, the caches, the preliminary fine-tuning's pairs and the pre-training texts (the main process
    mines and fills the caches first, the others read what it wrote)."""
    tr, neg, m, cache = recipe.training, recipe.negatives, recipe.model, ctx.cache
    split = recipe.data.train_split
    t0 = time.perf_counter()
    pre, pt = recipe.prefinetune, recipe.pretrain
    pairs = load_pairs(ctx.resolve(pre.data), pre.split) if pre is not None else None  # fail before any load
    pt_splits = (pt.query_splits if pt.query_splits is not None else [split]) if pt is not None else []
    own = pt is not None and pt.data is None  # pre-training texts from the recipe's own data
    data = load_beir(ctx.resolve(recipe.data.path), sorted({split, *(pt_splits if own else [])}))
    pt_texts = _pretrain_texts(pt, data if own else None, pt_splits, ctx) if pt is not None else None
    train_texts = data.doc_texts() + [data.queries[q] for q in data.qrels[split]] if m.extend_vocab else []
    model = HyReCModel.from_backbone(m.backbone, model_config(recipe), extend_with=train_texts, seed=tr.seed,
                                     num_layers=m.num_layers, scratch=m.init == "scratch")
    model.to(ctx.device)
    ctx.log(f"HyReC: {m.backbone}{' (architecture only, weights from scratch)' if m.init == 'scratch' else ''}, "
            f"{model._n_shared} shared + {len(model.lexicon)} lexicon + "
            f"{m.branch_layers} dense layers ({m.variant}), {model.vocab_size} tokenizer terms")
    state_cache = None
    if tr.state_cache != "off":
        state_cache = SharedStateCache(cache if tr.state_cache == "disk" else None)
    view = backbone_view(model.st) if tr.dense_inputs == "cache" else None
    cached_dense = None
    miner = share_miner_encoding(ctx, data, neg.source, neg.num, neg.miner)  # >1 process: shared corpus encode
    with ctx.accelerator.main_process_first():  # mining and cache fills: the others then read the caches
        examples = build_examples(data, split, negatives=neg.source if neg.num else "none", window=neg.window,
                                  num_negatives=max(neg.num, 1), max_queries=recipe.data.max_train_examples,
                                  miner_model=miner, language=m.language, cache=cache,
                                  seed=tr.seed, show_progress=ctx.show_progress)
        docs = sorted({t for e in examples for t in [e.positive, *e.negatives[: neg.num]]})
        if state_cache is not None:
            lex, pooled = not tr.train_lexicon_encoder, tr.dense_inputs == "states"
            state_cache.warm(model, [e.query for e in examples], "query", lexicon=lex, pooled=pooled,
                             show_progress=ctx.show_progress)
            state_cache.warm(model, docs, "document", lexicon=lex, pooled=pooled, show_progress=ctx.show_progress)
        if view is not None:  # read once here; training steps look their rows up in memory
            cached_dense = CachedDenseInputs(cache, view, [e.query for e in examples], docs).fill(ctx.show_progress)
        pre_examples = _prefinetune_examples(pre, pairs, ctx) if pre is not None else None
    del miner  # mining is done: a miner loaded here leaves the device before training
    ctx.result.encode_seconds += time.perf_counter() - t0
    ctx.result.details.update(train_examples=len(examples), n_terms=model.n_terms)
    ctx.log(f"training on {len(examples)} examples")

    def pooled_states(texts, role):  # dense_inputs: states, the frozen dense encoder's pooled inputs
        return state_cache.pooled(model, list(texts), role)

    dense_inputs = {"model": None, "cache": cached_dense, "states": pooled_states}[tr.dense_inputs]
    return RunInputs(model, data, examples, state_cache, dense_inputs, pre_examples, pt_texts)


def pretrain_phase(recipe: HyReCRecipe, run: RunInputs, ctx) -> tuple[HyReCPretraining, Stage]:
    """``(module, stage)`` of RetroMAE pre-training (:func:`pretrain_stage`) on the pre-training texts."""
    pt = recipe.pretrain
    ctx.log(f"RetroMAE pre-training on {len(run.pretrain_texts)} texts")
    return pretrain_stage(run.model, run.pretrain_texts, _global_batch(pt, pt.batch_size_scope, ctx),
                          recipe.training, name="pretrain")


def prefinetune_phase(recipe: HyReCRecipe, run: RunInputs, ctx) -> Stage:
    """The preliminary fine-tuning's stage: in-batch negatives only, its own optimiser and schedule."""
    tr = recipe.training
    ctx.log(f"preliminary fine-tuning on {len(run.prefinetune_examples)} of "
            f"{ctx.result.details['prefinetune']['pairs']} pairs")
    return hyrec_stage(run.model, run.prefinetune_examples,
                       _global_batch(recipe.prefinetune.training(tr), tr.batch_size_scope, ctx), recipe.loss,
                       negatives=0, state_cache=run.state_cache, dense_inputs=run.dense_inputs, name="prefinetune")


def finetune_phase(recipe: HyReCRecipe, run: RunInputs, ctx) -> list[Stage]:
    """The main fine-tuning's stage, or with ``negatives.refresh_every`` its ANCE-style self-mining rounds:
    each round after the first re-mines the negatives with the model being trained (:func:`_self_mining`)."""
    tr, neg = recipe.training, recipe.negatives
    main = hyrec_stage(run.model, run.examples, _global_batch(tr, tr.batch_size_scope, ctx), recipe.loss,
                       negatives=neg.num, state_cache=run.state_cache, dense_inputs=run.dense_inputs)
    if neg.refresh_every is None:
        return [main]
    every = neg.refresh_every
    if neg.refresh_unit == "epochs":
        every *= -(-len(run.examples) // main.optim.effective_batch_size)
    rounds = refreshed_stages(main, every, _self_mining(recipe, run, ctx), tr.seed)
    ctx.log(f"self-mining: {len(rounds) - 1} refresh(es) of the negatives, every {every} steps")
    ctx.result.details["self_mining"] = {"every_steps": every, "rounds": len(rounds), "changed": {}}
    return rounds


def _global_batch(section, scope: str, ctx):
    """``section`` with its global batch: ``per_device`` scope multiplies ``batch_size`` by the processes."""
    if scope != "per_device":
        return section
    world = ctx.accelerator.num_processes
    ctx.log(f"batch_size {section.batch_size} per device x {world} process(es): global batch "
            f"{section.batch_size * world}")
    return section.model_copy(update={"batch_size": section.batch_size * world})


def _self_mining(recipe: HyReCRecipe, run: RunInputs, ctx) -> Callable[[int], None]:
    """``refresh(r)``: round ``r``'s negatives for every example, mined by the model being trained
    (:func:`~medadapt.hyrec.data.remine_negatives`; the main process mines, the others read) and kept in
    ``<checkpoints>/self-mining/round-<r>.json`` with the run's fingerprint, so a resume inside round ``r``
    reuses them instead of mining with the weights it resumed from. The fraction of examples whose
    negatives changed goes to ``details["self_mining"]["changed"]``."""
    neg, examples = recipe.negatives, run.examples

    def refresh(r: int) -> None:
        path = ctx.checkpoint_dir / "self-mining" / f"round-{r}.json"
        with ctx.accelerator.main_process_first():
            saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
            negatives = saved.get("negatives") if saved.get("fingerprint") == ctx.fingerprint else None
            if negatives is None or len(negatives) != len(examples):
                negatives = remine_negatives(examples, run.data, recipe.data.train_split, run.model,
                                             window=neg.window, num_negatives=neg.num, seed=recipe.training.seed + r,
                                             show_progress=ctx.show_progress)
                if ctx.is_main:
                    atomic_write_json(path, {"fingerprint": ctx.fingerprint, "round": r, "negatives": negatives})
        changed = sum(e.negatives[: neg.num] != n[: neg.num] for e, n in zip(examples, negatives))
        for e, n in zip(examples, negatives):
            e.negatives = n
        ctx.result.details["self_mining"]["changed"][str(r)] = changed / len(examples)
        ctx.log(f"self-mining round {r}: the model's own negatives ({changed} of {len(examples)} examples changed)")

    return refresh


def _prefinetune_examples(pre: PrefinetuneSection, pairs: list[tuple[str, str]], ctx) -> list[Example]:
    """The preliminary fine-tuning's examples: ``pairs`` scored by ``pre.scorer`` (through the run's
    EmbeddingCache) and kept at cosine ``>= pre.min_score``; records the counts in
    ``ctx.result.details["prefinetune"]``."""
    scores = None
    if pre.scorer is not None:
        scorer = load(pre.scorer, device=ctx.device)
        scores = score_pairs(scorer, pairs, cache=ctx.cache, batch_size=pre.score_batch_size,
                             show_progress=ctx.show_progress)
        del scorer
    kept = filter_pairs(pairs, scores, pre.min_score, max_pairs=pre.max_pairs, seed=ctx.recipe.training.seed)
    n_pass = len(pairs) if scores is None else sum(s >= pre.min_score for s in scores)
    ctx.result.details["prefinetune"] = {"pairs": len(pairs), "passed_filter": n_pass, "train_examples": len(kept),
                                         "scorer": pre.scorer, "min_score": pre.min_score}
    return kept


def _pretrain_texts(pt: PretrainSection, data, splits: list[str], ctx) -> list[str]:
    """The pre-training texts (see :class:`~medadapt.hyrec.sections.PretrainSection`): distinct, shuffled
    with the run's seed, capped at ``max_texts``. ``data``: the recipe's loaded BEIR data when ``pt.data`` is
    unset."""
    texts: list[str] = []
    if data is None:
        path = Path(ctx.resolve(pt.data))
        if path.is_dir():
            data = load_beir(path, splits or None)
        elif path.is_file():
            if pt.query_splits:
                raise ConfigError(f"pretrain.query_splits needs a BEIR folder as pretrain.data, not a file "
                                  f"({path})")
            texts = [field(obj, "text", str, path, n) for n, obj in iter_jsonl(path, "pre-training texts")]
        else:
            raise DataError(f"pre-training texts not found: {path} (a BEIR folder or a JSONL file of "
                            "{\"text\": ...} lines)")
    if data is not None:
        for s in splits:
            texts += list(data.split_queries(s).values())
        if pt.include_corpus:
            texts += data.doc_texts()
    texts = [t for t in dict.fromkeys(texts) if t.strip()]
    if not texts:
        raise DataError(f"pretrain: no texts ({pt.data or 'data.path'}: no corpus document or query)")
    random.Random(ctx.recipe.training.seed).shuffle(texts)
    return texts[: pt.max_texts] if pt.max_texts else texts
