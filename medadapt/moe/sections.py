"""The configuration sections of Med-MoE-Embed training: ``head``, ``loss`` and ``training``.

They are both the ``moe`` recipe's sections (:class:`~medadapt.moe.recipe.MoERecipe`) and the arguments of
the Python API (:func:`~medadapt.moe.schedule.train_head`): one class, one set of defaults.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from medadapt.config import Section
from medadapt.errors import ConfigError
from medadapt.heads.linear import LinearHeadConfig, SearchAdaptorConfig
from medadapt.losses.infonce import InfoNCELoss
from medadapt.losses.load_balance import LoadBalanceLoss
from medadapt.moe.config import DOMAIN_SCALE_GRID, MoEConfig
from medadapt.recipes.base import RunSection
from medadapt.training.config import OptimSection

if TYPE_CHECKING:
    from medadapt.losses.infonce import InfoNCELoss
    from medadapt.losses.load_balance import LoadBalanceLoss

__all__ = ["HeadSection", "InfoNCESection", "LossSection", "MoEHeadSection", "MoETrainingSection", "NoHead"]

#: ``MoEConfig``'s fields: the head section takes its defaults from them (it repeats none of its own).
_MOE = {f.name: f for f in dataclasses.fields(MoEConfig)}


class NoHead(Section):
    """No head: train (``model.peft`` / ``freeze_backbone: false``) or evaluate the backbone alone."""

    kind: Literal["none"] = "none"


class MoEHeadSection(Section):
    """A :class:`~medadapt.moe.head.MoEHead`; the fields (and defaults) are
    :class:`~medadapt.moe.config.MoEConfig`'s, minus ``dim`` (taken from the backbone), the run-time
    ``routing`` mode (set by the training schedule) and ``input_name``, plus ``route`` (where the head
    sits)."""

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
    def _valid_grid(self) -> MoEHeadSection:
        bad = [g for g in self.domain_scale_grid if not 0.0 <= g <= 1.0]
        if bad or not self.domain_scale_grid:
            raise ValueError(f"domain_scale_grid must be a non-empty list of scales in [0, 1], got "
                             f"{self.domain_scale_grid}")
        if self.domain_routing and not self.residual:
            raise ValueError("domain_routing chooses a residual scale per domain: it needs residual: true")
        return self

    @model_validator(mode="after")
    def _valid_moe(self) -> MoEHeadSection:
        try:
            self.to_config(dim=8)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return self


#: ``head:`` of a ``moe`` recipe: ``none``, ``moe`` (:class:`MoEHeadSection`), ``linear``
#: (:class:`~medadapt.heads.linear.LinearHeadConfig`: identity-initialised W e, LlamaIndex / Chroma) or
#: ``search_adaptor`` (:class:`~medadapt.heads.linear.SearchAdaptorConfig`: e + s W e, W zero-initialised).
#: Each takes ``route`` (all / query / document). Only ``moe`` has the shared / random-routing stages and the
#: load-balancing term.
HeadSection = Annotated[Union[NoHead, MoEHeadSection, LinearHeadConfig, SearchAdaptorConfig],
                        Field(discriminator="kind")]


class InfoNCESection(Section):
    """InfoNCE on cosine similarity with in-batch (and mined hard) negatives, plus the MoE Switch
    load-balancing term weighted by ``load_balance_weight`` (:meth:`build`; a head without routed experts
    has no such term, and a ``moe`` recipe refuses an explicit non-zero weight for a non-MoE head)."""

    kind: Literal["infonce"] = "infonce"
    temperature: float = Field(0.05, gt=0)
    load_balance_weight: float = Field(0.01, ge=0)

    def build(self) -> tuple[InfoNCELoss, LoadBalanceLoss]:
        """The two loss modules: :class:`~medadapt.losses.InfoNCELoss` at ``temperature`` and
        :class:`~medadapt.losses.LoadBalanceLoss` at ``load_balance_weight``."""
        return InfoNCELoss(self.temperature), LoadBalanceLoss(self.load_balance_weight)


LossSection = Annotated[Union[InfoNCESection], Field(discriminator="kind")]


class MoETrainingSection(RunSection, OptimSection):
    """How the head (or backbone) trains: :class:`~medadapt.recipes.base.RunSection` plus
    :class:`~medadapt.training.config.OptimSection` with the MoE recipes' defaults and the two-step
    schedule of :mod:`medadapt.moe.schedule` (paper §III-D). ``max_steps`` caps each stage; ``batch_size``
    is the global batch (queries per optimiser step before accumulation)."""

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
