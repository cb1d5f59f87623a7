"""HyReC training (§3.2) as a :class:`~medadapt.training.loop.Step` of the one training loop.

Each item is one :class:`~medadapt.hyrec.data.Example` (query, positive, hard negatives): :class:`HyReCStep`
encodes it, :meth:`HyReCStep.loss` computes :class:`~medadapt.losses.HyReCLoss` on the gathered step. The
frozen variant reads cached states (:class:`~medadapt.hyrec.data.SharedStateCache`, ``dense_inputs``).
:func:`pretrain_stage` is RetroMAE pre-training (§4.1.3, Appendix A; :mod:`medadapt.training.retromae`) as
the first stage of the same loop; :func:`refreshed_stages` cuts a stage into self-mining rounds.

Example:
    >>> res = train_hyrec(model, examples, HyReCTrainingSection(epochs=2, lr=1e-4), HyReCLossSection())
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.hyrec.data import Example, SharedStateCache, UnionLabelCache
from medadapt.hyrec.labels import IGNORE
from medadapt.hyrec.sections import HyReCLossSection, HyReCTrainingSection
from medadapt.losses.hyrec import HyReCLoss
from medadapt.training.checkpoint import CheckpointConfig
from medadapt.training.loop import Batch, LoopResult, Stage, train
from medadapt.training.retromae import RetroMAEPretrainer, RetroMAESection, RetroMAEStep

__all__ = ["HyReCPretraining", "HyReCStep", "copy_lexicon_from_dense", "hyrec_stage", "pretrain_stage",
           "refreshed_stages", "train_hyrec"]

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
        return train(model, [stage], seed=training.seed, accelerator=accelerator, checkpoint=checkpoint,
                     fingerprint=fingerprint, progress=progress)
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
        >>> train(module, [pre, hyrec_stage(model, examples, training)], seed=training.seed)
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
