"""The ``kind: moe`` recipe and its sections (``head``, ``loss`` and ``training`` are also the arguments of
:func:`~medadapt.moe.schedule.train_head`: one class, one set of defaults)::

    kind: moe
    name: med-moe-embed
    model:    {backbone: minilm, freeze_backbone: true}
    data:     {path: ../shared/data/medquad, train_split: train, hard_negatives: {window: [3, 30]}}
    head:     {kind: moe, top_k: 2}
    loss:     {kind: infonce, temperature: 0.05, load_balance_weight: 0.01}
    training: {shared_epochs: 2, random_routing_epochs: 1, epochs: 1, batch_size: 128, lr: 1.0e-3}
    eval:     {split: dev, metrics: [ndcg@10, recall@100], expected: {ndcg@10: 0.65}}
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from medadapt.adapters.compose import branch_kind
from medadapt.adapters.linear import LinearHeadConfig, SearchAdaptorConfig
from medadapt.config import Section, validate_each
from medadapt.curation.mining_config import MiningConfig
from medadapt.errors import ConfigError
from medadapt.losses.infonce import InfoNCELoss
from medadapt.losses.load_balance import LoadBalanceLoss
from medadapt.moe.config import DOMAIN_SCALE_GRID, MoEConfig
from medadapt.recipes.base import DataSection, EvalSection, LoraSection, RecipeBase, RunSection
from medadapt.training.config import OptimSection

__all__ = ["HeadSection", "InfoNCESection", "LinearQueryPeer", "LossSection", "MixSection", "MoEDataSection",
           "MoEEvalSection", "MoEHeadSection", "MoEModelSection", "MoERecipe", "MoETrainingSection", "NoHead",
           "PeerSection", "domain_name", "recipe_problem"]

#: ``MoEConfig``'s fields: the head section takes its defaults from them (it repeats none of its own).
_MOE = {f.name: f for f in dataclasses.fields(MoEConfig)}


class NoHead(Section):
    """No head: train (``model.peft`` / ``freeze_backbone: false``) or evaluate the backbone alone."""

    kind: Literal["none"] = "none"


class MoEHeadSection(Section):
    """A :class:`~medadapt.moe.head.MoEHead`: :class:`~medadapt.moe.config.MoEConfig`'s fields and defaults,
    minus ``dim`` (the backbone's), the run-time ``routing`` and ``input_name``, plus ``route``."""

    kind: Literal["moe"] = "moe"
    route: Literal["all", "query", "document"] = Field(
        "all", description="where the head sits: every input (all), or one route of an asymmetric (Router) "
        "base model; checked against medadapt.adapters.compose.ALLOWED")
    shared_experts: list[str] = Field(default_factory=_MOE["shared_experts"].default_factory)
    routed_experts: list[str] = Field(default_factory=_MOE["routed_experts"].default_factory)
    top_k: int = Field(_MOE["top_k"].default, ge=0)
    expansion: int = Field(_MOE["expansion"].default, ge=1)
    alpha_init: float = _MOE["alpha_init"].default
    residual: bool = _MOE["residual"].default
    residual_scale: float = Field(_MOE["residual_scale"].default, ge=0, le=1,
                                  description="WiSE-FT interpolation at inference (training uses 1)")
    zero_init_output: bool = _MOE["zero_init_output"].default
    renormalize_top_k: bool = _MOE["renormalize_top_k"].default
    gate_init_std: float = Field(_MOE["gate_init_std"].default, ge=0)
    expert_options: dict[str, dict[str, Any]] = Field(default_factory=_MOE["expert_options"].default_factory)
    domain_routing: bool = Field(False, description="with data.mix: after training, choose a residual scale per "
                                 "domain on its dev split and route each input to its domain's scale by a linear "
                                 "domain classifier on the frozen embedding (medadapt.moe.domains)")
    domain_scale_grid: list[float] = Field(default_factory=lambda: list(DOMAIN_SCALE_GRID),
                                           description="the residual scales tried per domain on dev")

    def to_config(self, dim: int) -> MoEConfig:
        """The head's :class:`~medadapt.moe.config.MoEConfig` for a backbone of width ``dim``."""
        return MoEConfig(dim=dim, **self.model_dump(exclude={"kind", "route", "domain_routing",
                                                             "domain_scale_grid"}))

    @model_validator(mode="after")
    def _valid(self) -> MoEHeadSection:
        bad = [g for g in self.domain_scale_grid if not 0.0 <= g <= 1.0]
        if bad or not self.domain_scale_grid:
            raise ValueError(f"domain_scale_grid must be a non-empty list of scales in [0, 1], got "
                             f"{self.domain_scale_grid}")
        if self.domain_routing and not self.residual:
            raise ValueError("domain_routing chooses a residual scale per domain: it needs residual: true")
        try:
            self.to_config(dim=8)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


#: ``head:`` of a ``moe`` recipe: ``none``, ``moe``, ``linear`` (identity-initialised W e, LlamaIndex / Chroma)
#: or ``search_adaptor`` (e + s W e, W zero-initialised); each takes ``route``. Only ``moe`` has the shared /
#: random-routing stages and the load-balancing term.
HeadSection = Annotated[Union[NoHead, MoEHeadSection, LinearHeadConfig, SearchAdaptorConfig],
                        Field(discriminator="kind")]


class InfoNCESection(Section):
    """InfoNCE on cosine similarity with in-batch (and mined hard) negatives, plus the Switch load-balancing
    term weighted by ``load_balance_weight`` (only heads with routed experts have one)."""

    kind: Literal["infonce"] = "infonce"
    temperature: float = Field(0.05, gt=0)
    load_balance_weight: float = Field(0.01, ge=0)

    def build(self) -> tuple[InfoNCELoss, LoadBalanceLoss]:
        return InfoNCELoss(self.temperature), LoadBalanceLoss(self.load_balance_weight)


LossSection = Annotated[Union[InfoNCESection], Field(discriminator="kind")]


class MoETrainingSection(RunSection, OptimSection):
    """How the head (or backbone) trains, with the two-step schedule of :mod:`medadapt.moe.schedule` (paper §III-D);
    ``max_steps`` caps each stage, ``batch_size`` is the global batch (before accumulation)."""

    epochs: int = Field(1, ge=0, description="epochs with the learned gate (all epochs for other heads)")
    shared_epochs: int = Field(0, ge=0, description="epochs training only the shared experts (routing off; "
                               "MoE heads only)")
    random_routing_epochs: int = Field(0, ge=0, description="epochs of random-routing warm-up (MoE heads only)")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(2e-5, gt=0, le=10.0)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)

    def optim(self, epochs: int) -> OptimSection:
        """The :class:`~medadapt.training.config.OptimSection` of one stage of ``epochs`` epochs."""
        return OptimSection(**{**self.model_dump(include=set(OptimSection.model_fields)), "epochs": epochs})


class LinearQueryPeer(Section):
    """``eval.peers: [linear_query]``: the query-only linear adapter trained with in-batch InfoNCE (defaults of
    ``recipes/linear-query-demo.yaml``; seed, device and precision are the run's)."""

    kind: Literal["linear_query"] = "linear_query"
    label: str = Field("linear query adapter", min_length=1,
                       description="name in the table, metrics.json, the card and the warning line")
    temperature: float = Field(0.05, gt=0, description="InfoNCE temperature")
    lr: float = Field(3e-3, gt=0, le=10.0)
    epochs: int = Field(20, ge=1)
    batch_size: int = Field(64, ge=1)
    weight_decay: float = Field(0.0, ge=0)

    def head_config(self) -> LinearHeadConfig:
        return LinearHeadConfig(route="query")

    def training(self, run: MoETrainingSection) -> MoETrainingSection:
        """Its own optimisation settings with the run's seed / device / precision."""
        return MoETrainingSection(epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                  weight_decay=self.weight_decay, seed=run.seed, device=run.device,
                                  mixed_precision=run.mixed_precision, encode_batch_size=run.encode_batch_size)

    def loss(self) -> InfoNCESection:
        return InfoNCESection(temperature=self.temperature, load_balance_weight=0.0)


#: one ``eval.peers`` entry; a bare name (``linear_query``) is that kind with its defaults
PeerSection = Annotated[Union[LinearQueryPeer], Field(discriminator="kind")]


class MoEEvalSection(EvalSection):
    """:class:`~medadapt.recipes.base.EvalSection` plus ``peers``: baselines trained in the same run on the same
    cached embeddings and scored on the same sets (:mod:`medadapt.moe.peers`)."""

    peers: list[PeerSection] = Field(default_factory=list, description="peer baselines trained in the same "
                                     "run on the same cached embeddings and scored on the same sets (fast "
                                     "path only), e.g. [linear_query] or [{kind: linear_query, lr: 1.0e-3}]")

    @field_validator("peers", mode="before")
    @classmethod
    def _names(cls, value):
        return [{"kind": v} if isinstance(v, str) else v for v in (value or [])]

    @field_validator("peers")
    @classmethod
    def _distinct(cls, value):
        labels = [p.label for p in value]
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"two peers are labelled {', '.join(twice)}; give one of them a label")
        return value


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


def domain_name(path: str) -> str:
    """A data set's domain name in a mix: the folder's (or builtin set's) last path component."""
    return Path(path.rstrip("/")).name or path


class MoEDataSection(DataSection):
    """Training pairs from the ``train_split`` qrels, with optional mined hard negatives; ``mix`` adds domains
    (train splits and corpora joined, negatives mined in the union) and ``balance: domain`` repeats the smaller
    ones to as many pairs per epoch. Evaluation stays on ``path`` (other domains: ``eval.also``)."""

    max_train_queries: int | None = Field(None, ge=1, description="train on the first N queries only")
    hard_negatives: MiningConfig | None = Field(
        None, description="mine hard negatives for each training query with the frozen backbone (dense)")
    mix: list[MixSection] = Field(default_factory=list, description="more domains to train on together")
    balance: Literal["none", "domain"] = Field(
        "none", description="domain: as many pairs per epoch from every domain of a mix (smaller ones repeated)")

    def domain_paths(self) -> dict[str, str]:
        """Domain name -> BEIR folder: ``path``'s and every ``mix`` entry's."""
        return {domain_name(self.path): self.path, **{m.name or domain_name(m.path): m.path for m in self.mix}}

    @model_validator(mode="after")
    def _mix_names(self):
        names = [domain_name(self.path)] + [m.name or domain_name(m.path) for m in self.mix]
        if len(set(names)) != len(names):
            raise ValueError(f"data.mix: two domains have the same name ({', '.join(names)}); set mix[].name")
        if self.balance == "domain" and not self.mix:
            raise ValueError("data.balance: domain needs data.mix (one domain is already balanced)")
        return self


class MoERecipe(RecipeBase):
    """A Med-MoE-Embed recipe (``kind: moe``)."""

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


def _stage_options(t: MoETrainingSection) -> list[str]:
    return [f"training.{name}={getattr(t, name)}" for name in ("shared_epochs", "random_routing_epochs")
            if getattr(t, name)]


def _moe_only_problem(recipe: MoERecipe) -> str | None:
    """MoE-only options set for another head kind."""
    if recipe.head.kind in ("none", "moe"):
        return None
    bad = _stage_options(recipe.training)
    if "load_balance_weight" in recipe.loss.model_fields_set and recipe.loss.load_balance_weight:
        bad.append(f"loss.load_balance_weight={recipe.loss.load_balance_weight}")
    if not bad:
        return None
    return (f"{', '.join(bad)}: MoE-only options (expert stages, load balancing) for head.kind "
            f"{recipe.head.kind}, which trains in one stage of training.epochs; remove them or set them to 0")


def _peers_problem(recipe: MoERecipe) -> str | None:
    """Why ``eval.peers`` cannot run: peers train on the fast path's cached embeddings beside a trained head."""
    if not getattr(recipe.eval, "peers", None):
        return None
    if not recipe.fast:
        return ("eval.peers trains peer baselines on the frozen backbone's cached embeddings: it needs the "
                "fast path (model.freeze_backbone: true, no model.peft)")
    if recipe.head.kind == "none":
        return "eval.peers compares peer baselines with a trained head: set head.kind"
    return None


def _no_epochs_problem(recipe: MoERecipe) -> str | None:
    """A head or backbone with every stage at 0 epochs: a no-op run would save untrained weights as trained."""
    head, t = recipe.head, recipe.training
    if recipe.fast and head.kind == "none":
        return None  # only branches train, with their own epochs (or recipe_problem says there are none)
    epochs = t.epochs
    moe_stages = recipe.fast and isinstance(head, MoEHeadSection)  # the stages moe.schedule runs for this head
    if moe_stages:
        epochs += t.shared_epochs if head.shared_experts else 0
        epochs += t.random_routing_epochs if head.routed_experts else 0
    if epochs:
        return None
    stages = ("training.epochs, training.shared_epochs and training.random_routing_epochs are 0"
              if moe_stages else "training.epochs is 0")
    return (f"{stages}: nothing would train and the untrained {'head' if recipe.fast else 'model'} would be "
            "saved; train at least 1 epoch (to score a model without training, use medadapt eval)")


def recipe_problem(recipe: MoERecipe) -> str | None:
    """Why ``recipe`` cannot train as written (``None`` when it can)."""
    if recipe.branches and not recipe.fast:
        return "branches compose onto a frozen backbone (model.freeze_backbone: true, no model.peft)"
    problem = _moe_only_problem(recipe) or _peers_problem(recipe) or _no_epochs_problem(recipe)
    if problem:
        return problem
    if getattr(recipe.head, "domain_routing", False) and not (recipe.fast and recipe.data.mix):
        return ("head.domain_routing chooses a residual scale per domain of data.mix: it needs data.mix and a "
                "head on a frozen backbone (model.freeze_backbone: true, no model.peft)")
    if recipe.fast:
        if recipe.head.kind == "none" and not recipe.branches:
            return ("nothing to train: the backbone is frozen, there is no model.peft adapter and head.kind "
                    "is none")
        return None
    ignored = _stage_options(recipe.training)
    routed = isinstance(recipe.head, MoEHeadSection) and bool(recipe.head.routed_experts)
    if routed and recipe.loss.load_balance_weight:
        ignored.append(f"loss.load_balance_weight={recipe.loss.load_balance_weight}")
    if getattr(recipe.head, "drift_weight", 0):
        ignored.append(f"head.drift_weight={recipe.head.drift_weight}")
    if ignored:
        return (f"{', '.join(ignored)}: the backbone / LoRA path has no stage schedule, no load-balancing "
                "term and no drift term (they apply to a head on a frozen backbone); set them to 0")
    return None
