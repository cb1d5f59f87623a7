"""The sections of a HyReC recipe (``kind: hyrec``): ``data``, ``model``, ``negatives``, ``loss``, ``training``,
``pretrain``, ``prefinetune``, ``eval``. They are the Python API's configs too
(:func:`medadapt.hyrec.train.train_hyrec` takes a :class:`HyReCTrainingSection` and a :class:`HyReCLossSection`);
:mod:`medadapt.hyrec.system` registers the kind."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from medadapt.config import Section
from medadapt.losses.hyrec import HyReCLoss
from medadapt.recipes.base import DataSection, EvalSection, RecipeBase, RunSection
from medadapt.training.config import OptimSection, SchedulerKind
from medadapt.training.retromae import RetroMAESection

__all__ = ["HyReCDataSection", "HyReCEvalSection", "HyReCLossSection", "HyReCModelSection", "HyReCRecipe",
           "HyReCTrainingSection", "NegativesSection", "PrefinetuneSection", "PretrainSection"]


class HyReCDataSection(DataSection):
    """The BEIR training data, optionally subsampled."""

    max_train_examples: int | None = Field(None, ge=1, description="random subset of (query, positive) pairs")


class HyReCModelSection(Section):
    """Backbone and GLAE split (small = 1+1+1 layers, base = 5+7+7 in the paper)."""

    backbone: str
    init: Literal["pretrained", "scratch"] = Field(
        "pretrained", description="scratch: the backbone's architecture and tokenizer with freshly drawn weights "
        "(needs a pretrain section: RetroMAE from scratch, as the paper)")
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
    per example are used in training (fewer when an example of the optimiser step has fewer).

    ``refresh_every`` (not in the paper, which mines once with its first-stage model): ANCE-style self-mining
    (Xiong et al. 2021). The first ``refresh_every`` epochs (or steps, ``refresh_unit``) of the main
    fine-tuning train on ``source``'s negatives; then, and every ``refresh_every`` after, the model being
    trained re-mines every example's negatives from its own dense side (same ``window`` and ``num``). The
    optimiser, schedule and data order are those of one uninterrupted stage, and each round's negatives are
    kept beside the checkpoints, so a resumed run repeats the uninterrupted one."""

    source: Literal["dense", "bm25", "none"] = "dense"
    miner: str = Field("minilm", description="embedder for source: dense")
    window: tuple[int, int] = (20, 100)
    num: int = Field(3, ge=0)
    refresh_every: int | None = Field(None, ge=1, description="ANCE-style self-mining: the trained model "
                                      "re-mines the negatives every N refresh_units (null: mined once, the paper)")
    refresh_unit: Literal["epochs", "steps"] = "epochs"


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
        return HyReCLoss(self.temperature, self.lexical_weight, self.dense_weight, self.union_weight,
                         self.hybrid_weight, self.hybrid_dense_weight)


class HyReCTrainingSection(OptimSection, RunSection):
    """Optimisation (``OptimSection`` with the paper's lr 5e-5, linear decay after a 5 % warm-up), the run
    settings (``RunSection``) and what trains. ``lr`` is the encoders' learning rate, ``head_lr`` the three
    projectors' (default ``lr``). ``batch_size`` is the number of examples per forward pass over all
    processes (``batch_size_scope: global``) or on each process (``per_device``: the global batch is
    ``batch_size`` x processes); ``prefinetune`` follows it, ``pretrain`` has its own."""

    lr: float = Field(5e-5, gt=0, le=10.0)
    batch_size_scope: Literal["global", "per_device"] = Field(
        "global", description="batch_size over all processes (global) or on each process (per_device)")
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
    batch_size_scope: Literal["global", "per_device"] = Field(
        "global", description="batch_size over all processes (global) or on each process (per_device)")


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
        if self.model.init == "scratch" and self.pretrain is None:
            raise ValueError("model.init: scratch starts from random weights: add a pretrain section (RetroMAE "
                             "pre-training from scratch, as the paper) or keep model.init: pretrained")
        neg = self.negatives
        if neg.refresh_every is not None:
            if neg.num == 0 or neg.source == "none":
                raise ValueError("negatives.refresh_every re-mines hard negatives: it needs negatives.num >= 1 "
                                 "and a first-round negatives.source (dense or bm25)")
            if frozen and not tr.train_dense_encoder:
                raise ValueError("negatives.refresh_every: the model mines with its own dense side, which does "
                                 "not train here (model.variant frozen, training.train_dense_encoder false)")
            if neg.refresh_unit == "epochs" and neg.refresh_every >= tr.epochs:
                raise ValueError(f"negatives.refresh_every: {neg.refresh_every} epochs >= training.epochs "
                                 f"({tr.epochs}): the negatives would never be refreshed")
        if self.negatives.num == 0 and tr.effective_batch_size < 2:
            raise ValueError("without hard negatives (negatives.num: 0) in-batch negatives need "
                             "training.batch_size * gradient_accumulation_steps >= 2")
        return self
