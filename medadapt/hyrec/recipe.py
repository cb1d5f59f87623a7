"""HyReC recipes (``kind: hyrec``, e.g. ``recipes/hyrec-tiny.yaml``; see ``docs/hyrec.md``): the schema
(``model``, ``negatives``, ``loss``, ``training``, ``eval``) and the system's ``train`` / ``evaluate`` for the
one runner (:func:`medadapt.recipes.run.run_recipe`).

The sections are the Python API's configs too (:func:`medadapt.hyrec.train.train_hyrec` takes a
:class:`HyReCTrainingSection` and a :class:`HyReCLossSection`). ``loss.union_weight: 0`` trains without the
semantic union (no union loss, no words in the training-time lexical score) and turns bagging off (the
paper's "w/o SU"). Metrics and ``eval.expected`` are ``<mode>/<metric>`` (``hybrid/ndcg@10``).

The paper's three training stages (Appendix A) are optional sections run in order through one training loop
(one checkpoint folder, resumable across every boundary): ``pretrain`` (RetroMAE masked-autoencoder
pre-training of the backbone) -> ``prefinetune`` (score-filtered pairs, in-batch negatives) -> the main
fine-tuning (``training``).
"""

from __future__ import annotations

import time
import weakref
from typing import Literal

from pydantic import Field, field_validator, model_validator

from medadapt.config import Section
from medadapt.recipes.base import DataSection, EvalSection, RecipeBase, RunSection
from medadapt.recipes.registry import RecipeKind, register_kind
from medadapt.training.config import OptimSection, SchedulerKind
from medadapt.training.retromae import RetroMAESection

__all__ = ["HyReCDataSection", "HyReCEvalSection", "HyReCLossSection", "HyReCModelSection", "HyReCRecipe",
           "HyReCTrainingSection", "NegativesSection", "PrefinetuneSection", "PretrainSection", "evaluate",
           "evaluate_modes", "model_config", "train"]


class HyReCDataSection(DataSection):
    """The BEIR training data, optionally subsampled."""

    max_train_examples: int | None = Field(None, ge=1, description="random subset of (query, positive) pairs")


class HyReCModelSection(Section):
    """Backbone and GLAE split (small = 1+1+1 layers, base = 5+7+7 in the paper)."""

    backbone: str
    branch_layers: int = Field(1, ge=1, description="N: layers of the lexicon and of the dense encoder")
    variant: Literal["full", "frozen"] = "full"
    pooling: Literal["cls", "mean"] = "cls"
    language: Literal["zh", "en"] = "zh"
    extend_vocab: bool = Field(False, description="add the CJK characters of corpus + training queries the "
                               "tokenizer maps to [UNK] as new tokens")
    query_max_length: int = Field(64, ge=4)
    passage_max_length: int = Field(256, ge=4)
    dense_max_length: int | None = Field(None, ge=4)
    n_word_buckets: int = Field(2**20, ge=1)
    keep_subterms: bool = True
    min_union: float = Field(0.0, ge=0, le=1)
    union_source: Literal["learned", "labels"] = "learned"  # bag words by the union head or by jieba + regex
    union_context: int = Field(0, ge=0, description="0: linear union projector (eq. 4); k > 0: MLP over a "
                               "window of 2k+1 lexicon states (not in the paper; for frozen lexicon encoders)")
    dense_weight: float = Field(1.0, ge=0)
    num_layers: int | None = Field(None, ge=1, description="keep only the backbone's first layers (CPU)")
    lexicon_layers: int | None = Field(None, ge=1,
                                       description="lexicon encoder depth (default branch_layers)")
    term_bias: bool = Field(False,
                            description="learned per-term bias in the weight projector (not in the paper)")


class NegativesSection(Section):
    """Hard negatives from ANN ranks ``window`` (Appendix B: 20-100) of a first-stage retriever; ``num``
    per example are used in training (fewer when an example of the optimiser step has fewer)."""

    source: Literal["dense", "bm25", "none"] = "dense"
    miner: str = Field("minilm", description="embedder for source: dense")
    window: tuple[int, int] = (20, 100)
    num: int = Field(3, ge=0)


class HyReCLossSection(Section):
    """``L = lexical_weight L_lex + dense_weight L_den + union_weight L_union`` (eq. 12-14), InfoNCE at
    ``temperature``; a weight of 0 drops that part. ``hybrid_weight`` (not in the paper, 0 by default) adds
    InfoNCE on the fused score ``lexical + hybrid_dense_weight * dense``
    (:class:`~medadapt.losses.hyrec.HyReCLoss`): in a lexical branch, where the dense side is fixed, it trains
    the branch to complement the dense model."""

    temperature: float = Field(0.05, gt=0)
    lexical_weight: float = Field(1.0, ge=0)
    dense_weight: float = Field(1.0, ge=0)
    union_weight: float = Field(1.0, ge=0)
    hybrid_weight: float = Field(0.0, ge=0, description="weight of the fused-score InfoNCE term (0: the paper)")
    hybrid_dense_weight: float = Field(1.0, gt=0, description="dense weight inside the fused training score")

    @model_validator(mode="after")
    def _some_weight(self) -> HyReCLossSection:
        if self.lexical_weight == self.dense_weight == self.union_weight == self.hybrid_weight == 0:
            raise ValueError("at least one of lexical_weight, dense_weight, union_weight, hybrid_weight must be > 0")
        return self

    def build(self):
        """The :class:`~medadapt.losses.hyrec.HyReCLoss` this section describes."""
        from medadapt.losses.hyrec import HyReCLoss

        return HyReCLoss(self.temperature, self.lexical_weight, self.dense_weight, self.union_weight,
                         self.hybrid_weight, self.hybrid_dense_weight)


class HyReCTrainingSection(OptimSection, RunSection):
    """Optimisation (``OptimSection`` with the paper's lr 5e-5, linear decay after a 5 % warm-up), the run
    settings (``RunSection``) and what trains. ``lr`` is the encoders' learning rate, ``head_lr`` the three
    projectors' (default ``lr``); ``batch_size`` is the global number of examples per forward pass."""

    lr: float = Field(5e-5, gt=0, le=10.0)
    scheduler: SchedulerKind = "linear"
    head_lr: float | None = Field(None, gt=0, le=10.0, description="projectors' learning rate (default: lr)")
    train_dense_encoder: bool = True
    train_lexicon_encoder: bool = Field(True, description="false (frozen variant + state cache): only the "
                                        "projectors train, on cached lexicon-encoder states")
    state_cache: Literal["off", "memory", "disk"] = Field(
        "off", description="frozen variant: cache the sharing backbone's token states")
    dense_inputs: Literal["model", "cache", "states"] = Field(
        "model", description="frozen dense encoder only: pooled dense inputs from the EmbeddingCache (cache) "
        "or computed once from the shared-state cache (states)")
    lexical_words: Literal["none", "labels", "predicted"] = Field(
        "predicted", description="words scored with the tokens in the training-time lexical score (eq. 10): "
        "the union head's arg-max (as bagged at inference), the labelling tool's, or none (ignored, i.e. "
        "none, for a model without the semantic union: loss.union_weight 0)")


class PretrainSection(RetroMAESection):
    """The paper's pre-training (Appendix A, §4.1.3): RetroMAE masked-autoencoder pre-training
    (:mod:`medadapt.training.retromae`, Xiao et al. 2022) of the BERT that HyReC then splits, i.e. the
    backbone's embeddings and every layer the model keeps (sharing backbone + dense encoder; the frozen
    variant keeps the embeddings and the sharing layers fixed and pre-trains the dense encoder only). When the
    stage ends the lexicon encoder is re-copied from the pre-trained dense layers ("the global-aware lexicon
    encoder and local-aware dense encoder are initialized with the same pretrained parameters"), and
    ``prefinetune`` / the main fine-tuning start from these weights; the RetroMAE decoder and MLM head are
    dropped. Runs first, in the same training loop as the other stages.

    Texts: ``data`` is a BEIR folder (default ``data.path``) whose corpus documents (``include_corpus``)
    and distinct queries of ``query_splits`` (default ``[data.train_split]``; ``[]`` for none) are read,
    or a JSONL file of ``{"text": ...}`` lines (RetroMAE's pre-training format; the paper pre-trains on
    WuDaoCorpora). Shuffled with ``training.seed``, capped at ``max_texts``. Defaults are the paper's
    (lr 1e-4, warm-up 0.1, weight decay 0.01); the paper does not give the mask ratios (RetroMAE's
    published 0.3 / 0.5 are the defaults), epochs or schedule."""

    data: str | None = Field(None, description="BEIR folder (default: data.path) or a JSONL file of "
                             "{\"text\": ...} lines")
    query_splits: list[str] | None = Field(None, description="BEIR folder: queries of these splits "
                                           "(default: [data.train_split])")
    include_corpus: bool = Field(True, description="BEIR folder: every corpus document")
    max_texts: int | None = Field(None, ge=1, description="random subset of the texts")
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    weight_decay: float = Field(0.01, ge=0)
    scheduler: SchedulerKind = "linear"


class PrefinetuneSection(Section):
    """The paper's preliminary fine-tuning (Appendix A): before the main fine-tuning, the model trains on a
    large set of (query, passage) pairs kept when a third-party embedder scores them at cosine
    ``>= min_score`` (the paper: 160M web pairs, Text2Vec-Chinese, 0.43), with the same loss and in-batch
    negatives only (no hard negatives). The main fine-tuning then starts from these weights, with its own
    optimiser and schedule; both stages run in one training loop (one checkpoint folder, resumable across
    the boundary). Unset fields take the ``training`` section's value."""

    data: str = Field(description="pairs: a FlagEmbedding JSONL file ({query, pos: [...]}, every positive is "
                      "one pair) or a BEIR folder (its positive qrels of `split`)")
    split: str = Field("train", description="qrels split of a BEIR folder")
    scorer: str | None = Field("shibing624/text2vec-base-chinese",
                               description="embedder whose cosine filters the pairs (null: keep every pair)")
    min_score: float = Field(0.43, ge=-1.0, le=1.0, description="keep pairs with scorer cosine >= this")
    score_batch_size: int = Field(64, ge=1)
    max_pairs: int | None = Field(None, ge=1, description="random subset of the kept pairs")
    epochs: int = Field(5, ge=1)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1, description="default: training.batch_size")
    lr: float | None = Field(None, gt=0, le=10.0, description="default: training.lr")
    head_lr: float | None = Field(None, gt=0, le=10.0, description="default: training.head_lr")
    warmup_ratio: float | None = Field(None, ge=0, lt=1, description="default: training.warmup_ratio")
    weight_decay: float | None = Field(None, ge=0, description="default: training.weight_decay")

    def training(self, main: HyReCTrainingSection) -> HyReCTrainingSection:
        """The stage's optimisation settings: ``main`` with this section's set fields."""
        update = {k: getattr(self, k) for k in ("epochs", "max_steps", "batch_size", "lr", "head_lr",
                                                  "warmup_ratio", "weight_decay")
                  if getattr(self, k) is not None or k == "max_steps"}
        return HyReCTrainingSection.model_validate({**main.model_dump(), **update})


class HyReCEvalSection(EvalSection):
    """Evaluation modes (each reported as ``<mode>/<metric>``), dense source and hybrid fusion."""

    modes: list[Literal["lexical", "dense", "hybrid"]] = Field(
        default_factory=lambda: ["lexical", "dense", "hybrid"])
    dense_source: Literal["model", "cache", "states"] = "model"
    fusion: Literal["nm", "minmax"] = "nm"
    batch_size: int = Field(32, ge=1)

    @field_validator("modes")
    @classmethod
    def _nonempty(cls, v):
        if not v:
            raise ValueError("modes must name at least one of lexical, dense, hybrid")
        return list(dict.fromkeys(v))


class HyReCRecipe(RecipeBase):
    """A HyReC training run (``kind: hyrec``); see the module docstring."""

    kind: Literal["hyrec"] = "hyrec"
    data: HyReCDataSection
    model: HyReCModelSection
    negatives: NegativesSection = Field(default_factory=NegativesSection)
    loss: HyReCLossSection = Field(default_factory=HyReCLossSection)
    training: HyReCTrainingSection = Field(default_factory=HyReCTrainingSection)
    eval: HyReCEvalSection = Field(default_factory=HyReCEvalSection)
    pretrain: PretrainSection | None = Field(None, description="RetroMAE pre-training of the backbone before "
                                             "every fine-tuning stage (paper Appendix A)")
    prefinetune: PrefinetuneSection | None = Field(None, description="preliminary fine-tuning on score-filtered "
                                                   "pairs before the main fine-tuning (paper Appendix A)")

    @model_validator(mode="after")
    def _consistent(self) -> HyReCRecipe:
        tr, frozen = self.training, self.model.variant == "frozen"
        if self.prefinetune is not None and self.prefinetune.training(tr).effective_batch_size < 2:
            raise ValueError("prefinetune trains with in-batch negatives only: its batch_size * "
                             "training.gradient_accumulation_steps must be >= 2")
        if self.pretrain is not None and frozen and not tr.train_dense_encoder:
            raise ValueError("pretrain: nothing to train: model.variant frozen keeps the embeddings and the "
                             "sharing layers fixed and training.train_dense_encoder is false; drop the pretrain "
                             "section or train the dense encoder")
        if tr.state_cache != "off" and not frozen:
            raise ValueError("training.state_cache needs model.variant: frozen")
        if tr.dense_inputs != "model" and (tr.train_dense_encoder or not frozen):
            raise ValueError(f"training.dense_inputs: {tr.dense_inputs} needs model.variant: frozen and "
                             "training.train_dense_encoder: false")
        if not tr.train_lexicon_encoder and (tr.state_cache == "off" or tr.dense_inputs == "model"):
            raise ValueError("training.train_lexicon_encoder: false needs a training.state_cache and "
                             "training.dense_inputs: cache or states")
        if (tr.dense_inputs == "states" or self.eval.dense_source == "states") and tr.state_cache == "off":
            raise ValueError("dense inputs from 'states' need training.state_cache: memory or disk")
        if self.negatives.num == 0 and tr.effective_batch_size < 2:
            raise ValueError("without hard negatives (negatives.num: 0) in-batch negatives need "
                             "training.batch_size * gradient_accumulation_steps >= 2")
        return self


def model_config(spec: HyReCRecipe):
    """The :class:`~medadapt.hyrec.model.HyReCConfig` of a recipe: the ``model`` section's architecture
    fields, ``union`` iff ``loss.union_weight > 0``."""
    import dataclasses

    from medadapt.hyrec.model import HyReCConfig

    fields = {f.name for f in dataclasses.fields(HyReCConfig)}
    return HyReCConfig(**spec.model.model_dump(include=fields), union=spec.loss.union_weight > 0)


# the SharedStateCache a model was trained with, for its evaluation (weak keys: it goes with the model)
_STATE_CACHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def train(recipe: HyReCRecipe, ctx):
    """Build the model and the examples (hard negatives and caches: the main process first, the others read
    what it wrote), train through ``ctx.train``, return the model; ``ctx.result.details`` gets
    ``train_examples``, ``n_terms`` and ``steps`` (and ``prefinetune``: pairs read / kept, steps; ``pretrain``:
    texts, steps, first and last loss). With a ``pretrain`` / ``prefinetune`` section, its stage runs first in
    the same loop (pretrain, then prefinetune) and the next stage continues from its weights."""
    from medadapt.cache import backbone_view
    from medadapt.data import load_beir
    from medadapt.hyrec.data import (
        CachedDenseInputs,
        SharedStateCache,
        build_examples,
        load_pairs,
        share_miner_encoding,
    )
    from medadapt.hyrec.model import HyReCModel
    from medadapt.hyrec.train import hyrec_stage, pretrain_stage

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
                                     num_layers=m.num_layers)
    model.to(ctx.device)
    ctx.log(f"HyReC: {m.backbone}, {model._n_shared} shared + {len(model.lexicon)} lexicon + "
            f"{m.branch_layers} dense layers ({m.variant}), {model.vocab_size} tokenizer terms")
    state_cache = None
    if tr.state_cache != "off":
        state_cache = SharedStateCache(SharedStateCache.default_root() if tr.state_cache == "disk" else None)
    view = backbone_view(model.st) if tr.dense_inputs == "cache" else None
    cached_dense = None

    def dense_inputs(texts, role):  # the frozen dense encoder's pooled inputs (dense_inputs: cache / states)
        if cached_dense is not None:
            return cached_dense(texts, role)
        return state_cache.pooled(model, list(texts), role)

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
    dense_fn = None if tr.dense_inputs == "model" else dense_inputs
    stages = []
    if pre_examples is not None:  # in-batch negatives only; its own optimiser and schedule
        ctx.log(f"preliminary fine-tuning on {len(pre_examples)} of {len(pairs)} pairs")
        stages.append(hyrec_stage(model, pre_examples, pre.training(tr), recipe.loss, negatives=0,
                                  state_cache=state_cache, dense_inputs=dense_fn, name="prefinetune"))
    stages.append(hyrec_stage(model, examples, tr, recipe.loss, negatives=neg.num, state_cache=state_cache,
                              dense_inputs=dense_fn))
    run_model = model
    if pt_texts is not None:  # RetroMAE first: the loop trains the model plus the decoder and MLM head
        ctx.log(f"RetroMAE pre-training on {len(pt_texts)} texts")
        run_model, pt_stage = pretrain_stage(model, pt_texts, pt, tr, name="pretrain")
        stages.insert(0, pt_stage)
    res = ctx.train(run_model, stages)
    ctx.result.details["steps"] = res.steps
    if pre_examples is not None:
        ctx.result.details["prefinetune"]["steps"] = res.stage_steps.get("prefinetune", 0)
    if pt_texts is not None:
        rows = [r["loss"] for r in res.loss_history if r.get("stage") == "pretrain"]
        ctx.result.details["pretrain"] = {"texts": len(pt_texts), "steps": res.stage_steps.get("pretrain", 0),
                                          "first_loss": rows[0] if rows else None,
                                          "last_loss": rows[-1] if rows else None}
        del run_model, pt_stage  # the decoder and MLM head are not part of the model
    model.eval()
    if state_cache is not None:
        _STATE_CACHES[model] = state_cache
    return model


def _prefinetune_examples(pre: PrefinetuneSection, pairs: list[tuple[str, str]], ctx) -> list:
    """The preliminary fine-tuning's examples: ``pairs`` scored by ``pre.scorer`` (through the run's
    EmbeddingCache) and kept at cosine ``>= pre.min_score``; records the counts in
    ``ctx.result.details["prefinetune"]``."""
    from medadapt.hyrec.data import filter_pairs, score_pairs

    scores = None
    if pre.scorer is not None:
        from medadapt.models import load

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
    """The pre-training texts (see :class:`PretrainSection`): distinct, shuffled with the run's seed, capped
    at ``max_texts``. ``data``: the recipe's loaded BEIR data when ``pt.data`` is unset."""
    import random
    from pathlib import Path

    from medadapt.data import load_beir
    from medadapt.errors import ConfigError, DataError

    texts: list[str] = []
    if data is None:
        path = Path(ctx.resolve(pt.data))
        if path.is_dir():
            data = load_beir(path, splits or None)
        elif path.is_file():
            from medadapt.data.jsonl import field, iter_jsonl

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


def evaluate(recipe: HyReCRecipe, model, ctx) -> dict[str, float]:
    """``<mode>/<metric>`` for every mode of ``eval.modes`` on ``eval.data`` (default ``data.path``), split
    ``eval.split``; the per-mode dicts also go to ``ctx.result.details["mode_metrics"]``."""
    from medadapt.data import load_beir

    ev = recipe.eval
    data = load_beir(ctx.resolve(ev.data or recipe.data.path), [ev.split])
    state_cache = _STATE_CACHES.get(model)
    cached_lexicon = state_cache is not None and not recipe.training.train_lexicon_encoder
    modes = evaluate_modes(model, data, ev, cache=ctx.cache, state_cache=state_cache,
                           show_progress=ctx.show_progress, cached_lexicon=cached_lexicon)
    ctx.result.details["mode_metrics"] = modes
    return {f"{m}/{k}": v for m, vals in modes.items() for k, v in vals.items()}


def evaluate_modes(model, data, ev: HyReCEvalSection, *, cache=None, state_cache=None, show_progress=True,
                   cached_lexicon: bool = False) -> dict[str, dict[str, float]]:
    """Every mode of ``ev.modes`` from one encoding pass (hybrid computes the lexical and dense runs too)."""
    from medadapt.eval.metrics import evaluate_run
    from medadapt.hyrec.evaluate import evaluate_hyrec

    modes = ev.modes
    mode = "hybrid" if "hybrid" in modes or {"lexical", "dense"} <= set(modes) else modes[0]
    res, runs = evaluate_hyrec(model, data, ev.split, mode, ev.metrics, cache=cache, state_cache=state_cache,
                               dense_source=ev.dense_source, fusion=ev.fusion, batch_size=ev.batch_size,
                               show_progress=show_progress, return_runs=True, cached_lexicon=cached_lexicon)
    out = {}
    for m in modes:
        vals = evaluate_run(data.qrels[ev.split], runs[m], ev.metrics)
        if m != "dense" and "q_terms" in res:
            vals.update({"q_terms": res["q_terms"], "d_terms": res["d_terms"]})
        out[m] = vals
    return out


#: ``medadapt train --paper``: HyReC's fine-tuning as §3 / §4.1.3 / Appendix A-B give it (the small model's batch).
#: The backbone and its depth, data and the negatives' miner stay the recipe's (the paper's backbone is not public).
PAPER = {
    "model.variant": ("full", "§3: every encoder and projector trains"),
    "model.pooling": ("cls", "§3.1: [CLS] pooling of the dense encoder"),
    "model.query_max_length": (64, "§4.1.3: query length 64"),
    "model.passage_max_length": (256, "§4.1.3: passage length 256"),
    "model.union_context": (0, "eq. (4): a linear union projector"),
    "model.term_bias": (False, "eq. (5): no per-term bias"),
    "model.dense_weight": (1.0, "eq. (15): S = S_lex + S_den"),
    "negatives.source": ("dense", "Appendix B: hard negatives from a first-stage dense retriever's ANN ranks"),
    "negatives.window": ([20, 100], "Appendix B: ranks 20-100"),
    "negatives.num": (3, "Appendix B: 3 hard negatives per query"),
    "loss.temperature": (0.05, "§3.4: InfoNCE at tau = 0.05"),
    "loss.lexical_weight": (1.0, "eq. (14): L = L_lex + L_den + L_union"),
    "loss.dense_weight": (1.0, "eq. (14)"),
    "loss.union_weight": (1.0, "eq. (14)"),
    "training.lr": (5e-5, "Appendix A: lr 5e-5"),
    "training.weight_decay": (0.01, "Appendix A: weight decay 0.01"),
    "training.epochs": (5, "Appendix A: 5 epochs (small model)"),
    "training.batch_size": (64, "Appendix A: batch 64 (small model)"),
    "training.train_dense_encoder": (True, "§3: everything trains"),
    "training.train_lexicon_encoder": (True, "§3: everything trains"),
    "training.state_cache": ("off", "a training encoder has no cacheable states"),
    "training.dense_inputs": ("model", "a training encoder has no cacheable states"),
    "eval.dense_source": ("model", "a trained encoder has no cached states to read"),
}

register_kind(RecipeKind("hyrec", HyReCRecipe, train, evaluate,
                         summary="HyReC: learned lexical + dense retrieval from one model (GLAE, semantic union)",
                         paper=PAPER))


def plan_spec(recipe: HyReCRecipe):
    """What ``medadapt plan`` needs (:mod:`medadapt.plan`): the GLAE encoder (the backbone's first
    ``num_layers`` layers plus the lexicon copy of ``lexicon_layers`` layers) with its projectors, the
    RetroMAE pre-training phase when the recipe has one (one text of ``pretrain.max_length`` tokens), the
    preliminary fine-tuning phase when the recipe has one (a query and its positive), and the fine-tuning
    phase (a query of ``query_max_length`` tokens, its positive and ``negatives.num`` passages of
    ``passage_max_length``)."""
    from medadapt.plan import ModelSpec, PhaseSpec, PlanSpec, Usage, find_config
    from medadapt.plan.memory import mlm_logit_bytes

    m, tr = recipe.model, recipe.training
    cfg, _ = find_config(m.backbone, recipe._source)
    h = int(cfg.get("hidden_size") or 0)
    projectors = (h + 1) + (4 * h + 4) + (h * h + h)  # weight (h -> 1), union (h -> 4), dense (h -> h)
    full = m.variant == "full"
    models = [ModelSpec("encoder", m.backbone, num_layers=m.num_layers,
                        extra_layers=m.lexicon_layers or m.branch_layers, head_params=projectors if full else 0)]
    if not full:
        models.append(ModelSpec("projectors", None, head_params=projectors))
    passages = 1 + (recipe.negatives.num if recipe.negatives.source != "none" else 0)
    uses = (Usage("encoder", 1, m.query_max_length, trains=full),
            Usage("encoder", passages, m.passage_max_length, trains=full)) + \
        (() if full else (Usage("projectors", 1 + passages, 1),))
    phases = (PhaseSpec("fine-tuning", tr.batch_size, tr.gradient_accumulation_steps, uses),)
    notes = (f"hard negatives are mined with {recipe.negatives.miner} before training (inference only, not planned)",) \
        if recipe.negatives.source == "dense" else ()
    pre = recipe.prefinetune
    if pre is not None:  # query + its positive, in-batch negatives only
        ptr = pre.training(tr)
        pre_uses = (Usage("encoder", 1, m.query_max_length, trains=full),
                    Usage("encoder", 1, m.passage_max_length, trains=full)) + \
            (() if full else (Usage("projectors", 2, 1),))
        phases = (PhaseSpec("preliminary fine-tuning", ptr.batch_size, ptr.gradient_accumulation_steps,
                            pre_uses), *phases)
        if pre.scorer is not None:
            notes += (f"preliminary pairs are scored with {pre.scorer} before training (inference only, not planned)",)
    pt = recipe.pretrain
    if pt is not None:  # the backbone once per text, + the MLM head's logits on the masked tokens
        length = pt.max_length or m.dense_max_length or m.passage_max_length
        masked = (pt.encoder_mask_ratio + pt.decoder_mask_ratio) * length  # MLM logits on masked tokens only
        logits = mlm_logit_bytes(masked, int(cfg.get("vocab_size") or 0))
        phases = (PhaseSpec("RetroMAE pre-training", pt.batch_size, pt.gradient_accumulation_steps,
                            (Usage("encoder", 1, length, trains=full or tr.train_dense_encoder),),
                            extra_bytes_per_example=logits), *phases)
        note = (f"RetroMAE pre-training: the MLM head's logits on the masked tokens are counted ({logits / 2**30:.3f} "
                "GB per example); the one-layer decoder is not; the lexicon copy does not run there but is counted")
        notes += (note,)
    return PlanSpec(recipe.name, tuple(models), phases, tr.mixed_precision, notes)


def _register_planner() -> None:
    from medadapt.plan import register_planner

    register_planner("hyrec", plan_spec)


_register_planner()
