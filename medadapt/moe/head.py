"""Med-MoE-Embed head as a sentence-transformers module (paper §III-A, eq. 1-2).

    h = sum_i E_i^(s)(v) + alpha * sum_{i in top-k} g_i E_i^(r)(v)

applied to the pooled ``features["sentence_embedding"]`` ``v`` of a frozen backbone, before ``Normalize``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from medadapt.adapters.stack import EmbeddingModule
from medadapt.domains import domain_mix, domain_probabilities
from medadapt.errors import ConfigError
from medadapt.moe.config import MoEConfig
from medadapt.moe.routing import RoutingMode, TopKRouter

__all__ = ["MoEHead"]


def _scalar_to_vector(name: str):
    """A load-state-dict pre-hook reading a 0-dim ``name`` (saved before it became shape ``(1,)``) as ``(1,)``."""

    def hook(_module, state_dict, prefix, *_args, **_kwargs):
        key = prefix + name
        if key in state_dict and state_dict[key].dim() == 0:
            state_dict[key] = state_dict[key].reshape(1)

    return hook


class MoEHead(EmbeddingModule):
    """Shared + top-k routed experts on the sentence embedding (options: :class:`MoEConfig`). By default an
    untrained head returns the backbone embedding exactly (``residual``, ``zero_init_output``), so training learns a
    correction. Routing (:meth:`set_routing`): ``learned``, ``random`` (warm-up) or ``off``. Each forward stores the
    unweighted Switch load-balancing loss on ``last_aux_loss`` (in training also in ``features["moe_aux_loss"]``,
    kept out of inference outputs). Routing statistics are not saved.

    Example:
        >>> head = MoEHead(MoEConfig.paper(dim=384))
    """

    config_keys: list[str] = [f.name for f in dataclasses.fields(MoEConfig)]

    def __init__(self, config: MoEConfig | None = None, **config_kwargs: Any) -> None:
        super().__init__()
        if config is None:
            config = MoEConfig(**config_kwargs)
        elif config_kwargs:
            raise TypeError("Pass either a MoEConfig or its fields as keyword arguments, not both")
        self.config = config
        self.routing: RoutingMode = config.routing
        self.residual_scale: float = config.residual_scale  # run-time, like routing (see MoEConfig)
        self.shared_experts = nn.ModuleList(config.build_expert(name) for name in config.shared_experts)
        self.routed_experts = nn.ModuleList(config.build_expert(name) for name in config.routed_experts)
        self.router: TopKRouter | None = None
        self.alpha: nn.Parameter | None = None
        if config.routed_experts:
            self.router = TopKRouter(config.dim, len(config.routed_experts), config.top_k,
                                     renormalize=config.renormalize_top_k, init_std=config.gate_init_std)
            # shape (1,), not a 0-dim scalar: FSDP and DeepSpeed ZeRO flatten parameters and refuse scalars
            self.alpha = nn.Parameter(torch.full((1,), float(config.alpha_init)))
        self.last_aux_loss: Tensor = torch.zeros(())
        #: domain routing (``config.domains``): a linear domain classifier on the normalised input and each
        #: domain's residual scale; ``domain_routing`` is run-time (off while the head trains)
        self.domain_router: nn.Linear | None = None
        self.domain_routing: bool = bool(config.domains)
        if config.domains:
            self._build_domain_router(config.domain_scales)
        self.register_load_state_dict_pre_hook(_scalar_to_vector("alpha"))

    def forward(self, features: dict[str, Tensor | Any], **kwargs: Any) -> dict[str, Tensor | Any]:
        name = self.config.input_name
        features[name] = self.transform(features[name], routing_noise=features.get("routing_noise"))
        if self.training:
            features["moe_aux_loss"] = self.last_aux_loss
        return features

    def transform(self, v: Tensor, routing_noise: Tensor | None = None) -> Tensor:
        """The head on raw embeddings ``(..., dim)``; ``routing_noise`` (rows, routed experts): the random-routing
        scores (:meth:`~medadapt.moe.routing.TopKRouter.forward`), used only when routing is ``"random"``."""
        leading = v.shape[:-1]
        v = v.reshape(-1, self.config.dim)
        h = torch.zeros_like(v)
        for expert in self.shared_experts:
            h = h + expert(v)
        if self.router is not None and self.routing != "off":
            h = h + self.alpha * self._routed(v, routing_noise if self.routing == "random" else None)
        else:
            self.last_aux_loss = v.new_zeros(())
        out = v + self.scale_for(v) * h if self.config.residual else h
        return out.reshape(*leading, self.config.dim)

    def scale_for(self, v: Tensor) -> Tensor | float:
        """The residual scale of each row of ``v`` (rows, dim): ``residual_scale``, or with domain routing
        the domain classifier's probabilities times the domains' scales, shape (rows, 1)."""
        if self.domain_router is None or not self.domain_routing:
            return self.residual_scale
        return domain_mix(self.domain_router, v, self.domain_gammas).unsqueeze(-1)

    @property
    def domain_names(self) -> list[str]:
        """The domains of its domain routing (empty without): with :meth:`domain_probabilities`, the domain
        classifier protocol of :func:`medadapt.retrieval.late.domain_classifier`."""
        return list(self.config.domains) if self.domain_router is not None else []

    def domain_probabilities(self, v: Tensor) -> Tensor:
        """The domain classifier's probabilities (rows, domains) for raw embeddings ``v``."""
        if self.domain_router is None:
            raise ConfigError("this head has no domain routing (config.domains is empty)")
        return domain_probabilities(self.domain_router, v)

    def set_domains(self, domains: list[str], scales: list[float], weight: Tensor, bias: Tensor) -> None:
        """Install domain routing: ``domains`` with their residual ``scales`` and the fitted linear classifier
        (``weight``: (domains, dim), ``bias``: (domains,)). Saved with the head (config and weights)."""
        self.config = dataclasses.replace(self.config, domains=list(domains), domain_scales=list(scales))
        self._build_domain_router(self.config.domain_scales)
        with torch.no_grad():
            self.domain_router.weight.copy_(weight)
            self.domain_router.bias.copy_(bias)
        self.domain_routing = True

    def _build_domain_router(self, scales: list[float]) -> None:
        device = next(self.parameters()).device
        self.domain_router = nn.Linear(self.config.dim, len(scales)).to(device)
        self.domain_router.requires_grad_(False)  # fitted after training (medadapt.moe.domains), not by the loop
        self.register_buffer("domain_gammas", torch.tensor(scales, dtype=torch.float32, device=device))

    def _routed(self, v: Tensor, noise: Tensor | None = None) -> Tensor:
        """``sum_{top-k} g_i E_i(v)``, running each expert only on the inputs routed to it."""
        decision = self.router(v, self.routing, noise=noise)
        self.last_aux_loss = decision.aux_loss
        out = torch.zeros_like(v)
        for i, expert in enumerate(self.routed_experts):
            rows = decision.selected[:, i].nonzero(as_tuple=True)[0]
            if rows.numel() == 0:
                continue
            routed = decision.weights[rows, i : i + 1] * expert(v[rows])
            out = out.index_add(0, rows, routed.to(out.dtype))  # under autocast the expert may compute in bf16
        return out

    def set_routing(self, mode: RoutingMode) -> None:
        """Switch routing to ``"learned"``, ``"random"`` or ``"off"``."""
        if mode not in ("learned", "random", "off"):
            raise ConfigError(f"Unknown routing {mode!r}; valid: ['learned', 'random', 'off']")
        self.routing = mode

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by role: ``shared`` experts, ``routed`` experts and ``gate`` (centroids and alpha)."""
        gate = [] if self.router is None else [*self.router.parameters(), self.alpha]
        return {"shared": list(self.shared_experts.parameters()), "routed": list(self.routed_experts.parameters()),
                "gate": gate}

    def routing_stats(self) -> dict[str, Any]:
        """Per-routed-expert load fractions (``last_load``, ``running_load``), ``running_counts``,
        ``inputs_seen`` and the expert ``names``; empty lists without routed experts."""
        names = list(self.config.routed_experts)
        if self.router is None:
            empty: dict[str, Any] = {key: [] for key in ("last_load", "running_load", "running_counts")}
            return {"names": names, **empty, "inputs_seen": 0}
        return {"names": names, **self.router.stats()}

    def reset_routing_stats(self) -> None:
        if self.router is not None:
            self.router.reset_stats()

    def get_embedding_dimension(self) -> int:
        return self.config.dim

    def get_config_dict(self) -> dict[str, Any]:
        return dataclasses.replace(self.config, routing=self.routing, residual_scale=self.residual_scale).to_dict()

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MoEHead:
        return cls(MoEConfig.from_dict(config))

    def __repr__(self) -> str:
        cfg = self.config
        return (f"MoEHead(dim={cfg.dim}, shared={cfg.shared_experts}, routed={cfg.routed_experts}, "
                f"top_k={cfg.top_k}, residual={cfg.residual}, routing={self.routing!r})")
