"""Typed, validated configuration of :class:`~medadapt.moe.head.MoEHead`; saved inside the module."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, get_args

from torch import nn

from medadapt.errors import ConfigError
from medadapt.moe.experts.registry import build_expert, check_expert_options
from medadapt.moe.routing import RoutingMode

__all__ = ["MoEConfig", "MOE_CONFIG_FORMAT_VERSION"]

MOE_CONFIG_FORMAT_VERSION = 1
"""Stamp written as ``format_version`` next to the fields in saved configs."""

#: the residual scales tried on each domain's dev split by domain routing (:mod:`medadapt.moe.domains`). Capped at
#: 0.5: an in-source dev split always prefers the full correction, and scales above 0.5 lost up to 0.074 nDCG@10 on
#: a MedQuAD source held out of training (docs/benchmarks.md, "The multidomain head on a MedQuAD source it never
#: saw"); 0 lets a domain the head does not help stay exactly frozen.
DOMAIN_SCALE_GRID: tuple[float, ...] = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)

PAPER_ROUTED_EXPERTS = ("mlp_swiglu", "mlp_gelu", "kan", "mlp_kan")


@dataclass
class MoEConfig:
    """Configuration of a Med-MoE-Embed head (paper eq. 1-2), saved inside the module.

    Attributes:
        dim: embedding width ``h`` of the backbone (input and output of the head).
        shared_experts / routed_experts: registered expert names always applied / chosen by the gate (may be
            empty), ``top_k`` of them per input (0 iff there are none); ``expansion``: hidden width multiplier.
        alpha_init: initial routed-branch scale; non-zero with ``zero_init_output`` (else it never trains).
        residual / residual_scale: output ``v + γ h`` instead of ``h``; ``γ < 1`` interpolates toward the backbone
            at inference, WiSE-FT style (training uses ``γ = 1``).
        zero_init_output: zero the last layer of every expert, so ``h = 0`` at initialisation.
        routing, renormalize_top_k, gate_init_std: see :mod:`medadapt.moe.routing`.
        expert_options: per expert name, extra constructor options (``{"kan": {"grid_size": 8}}``), validated.
        input_name: feature key the head reads and overwrites.
        domains / domain_scales: the domains a trained head routes between and each one's residual scale
            (:mod:`medadapt.moe.domains`; empty: one ``residual_scale``).
    """

    dim: int
    shared_experts: list[str] = field(default_factory=lambda: ["mlp_swiglu"])
    routed_experts: list[str] = field(default_factory=lambda: list(PAPER_ROUTED_EXPERTS))
    top_k: int = 2
    expansion: int = 4
    alpha_init: float = 1.0
    residual: bool = True
    residual_scale: float = 1.0
    zero_init_output: bool = True
    routing: RoutingMode = "learned"
    renormalize_top_k: bool = True
    gate_init_std: float = 0.02
    expert_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    input_name: str = "sentence_embedding"
    domains: list[str] = field(default_factory=list)
    domain_scales: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.shared_experts = list(self.shared_experts)
        self.routed_experts = list(self.routed_experts)
        for f in dataclasses.fields(self):  # NaN / inf would train to a NaN head (recipes check the same)
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{f.name} must be a finite number, got {value}")
        if not 0.0 <= self.residual_scale <= 1.0:
            raise ConfigError(f"residual_scale must be in [0, 1], got {self.residual_scale}")
        if self.residual_scale != 1.0 and not self.residual:
            raise ConfigError("residual_scale only applies with residual=True")
        self.domains = [str(d) for d in self.domains]
        self.domain_scales = [float(g) for g in self.domain_scales]
        if len(self.domains) != len(self.domain_scales):
            raise ConfigError(f"domains ({len(self.domains)}) and domain_scales ({len(self.domain_scales)}) "
                              "must have the same length")
        if len(set(self.domains)) != len(self.domains):
            raise ConfigError(f"domains must be distinct, got {self.domains}")
        if self.domains and not self.residual:
            raise ConfigError("domains (a residual scale per domain) only apply with residual=True")
        if self.domains and len(self.domains) < 2:
            raise ConfigError("domain routing needs at least two domains")
        bad = [g for g in self.domain_scales if not (math.isfinite(g) and 0.0 <= g <= 1.0)]
        if bad:
            raise ConfigError(f"domain_scales must be in [0, 1], got {bad}")
        if self.dim < 1 or self.expansion < 1:
            raise ConfigError(f"dim and expansion must be >= 1, got {self.dim} and {self.expansion}")
        if not self.shared_experts and not self.routed_experts:
            raise ConfigError("MoEConfig needs at least one shared or routed expert")
        try:  # canonical JSON form, so a config equals its saved-and-reloaded self
            self.expert_options = json.loads(json.dumps(self.expert_options))
        except (TypeError, ValueError) as error:
            raise ConfigError(f"expert_options must be JSON-serialisable: {error}") from None
        for name in [*self.shared_experts, *self.routed_experts]:
            check_expert_options(name, self.expert_kwargs(name))  # unknown names/options list valid ones
        n_routed = len(self.routed_experts)
        if n_routed == 0 and self.top_k != 0:
            raise ConfigError(f"top_k must be 0 without routed experts, got {self.top_k}")
        if n_routed and not 1 <= self.top_k <= n_routed:
            raise ConfigError(f"top_k must be in [1, {n_routed}] (routed experts), got {self.top_k}")
        if self.routing not in get_args(RoutingMode):
            raise ConfigError(f"Unknown routing {self.routing!r}; valid: {list(get_args(RoutingMode))}")
        if n_routed and self.zero_init_output and self.alpha_init == 0:
            raise ConfigError("alpha_init=0 with zero_init_output=True leaves the routed branch untrainable")
        unused = sorted(set(self.expert_options) - set(self.shared_experts) - set(self.routed_experts))
        if unused:
            raise ConfigError(f"expert_options given for expert(s) not in this head: {unused}")

    @classmethod
    def paper(cls, dim: int, **overrides: Any) -> MoEConfig:
        """The paper's setting: 1 shared MLP-SwiGLU; routed MLP-SwiGLU, MLP-GELU, KAN, MLP-KAN; top-2."""
        return cls(dim=dim, **overrides)

    @classmethod
    def single_expert(cls, dim: int, expert: str = "mlp_swiglu", **overrides: Any) -> MoEConfig:
        """A residual single-expert head (``v + E(v)``): one shared expert, no routed experts."""
        return cls(dim=dim, shared_experts=[expert], routed_experts=[], top_k=0, **overrides)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with a ``format_version`` stamp."""
        return {"format_version": MOE_CONFIG_FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MoEConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ``ConfigError`` listing the valid ones."""
        data = dict(data)
        version = data.pop("format_version", MOE_CONFIG_FORMAT_VERSION)
        if version != MOE_CONFIG_FORMAT_VERSION:
            raise ConfigError(f"Unsupported MoEConfig format_version {version}; expected {MOE_CONFIG_FORMAT_VERSION}")
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(valid))
        if unknown:
            raise ConfigError(f"Unknown MoEConfig key(s) {unknown}; valid keys: {valid}")
        return cls(**data)

    def expert_kwargs(self, name: str) -> dict[str, Any]:
        """Constructor options for expert ``name``: shared defaults plus ``expert_options[name]``."""
        shared = {"expansion": self.expansion, "zero_init_output": self.zero_init_output}
        return {**shared, **self.expert_options.get(name, {})}

    def build_expert(self, name: str) -> nn.Module:
        """Instantiate expert ``name`` with this config's options."""
        return build_expert(name, self.dim, **self.expert_kwargs(name))

