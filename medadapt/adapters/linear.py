"""The built-in head types: :class:`LinearHead` (``kind: linear``, ``e' = W e (+ b)``, ``W = I`` at init: the
linear query adapter of LlamaIndex and Chroma) and :class:`SearchAdaptorHead` (``kind: search_adaptor``,
``e' = e + s * (W e (+ b))``, ``W = 0`` at init, optional L2 pull toward ``e`` in training; Yoon et al., ACL 2024).
Untrained, both return ``e`` exactly; on the ``query`` route documents and their index stay the frozen model's.
The configs serve both ``model.add_adapter(LinearHeadConfig())`` and a recipe's ``head: {kind: linear}``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from medadapt.adapters.stack import EmbeddingModule
from medadapt.adapters.types import AdapterType, register_adapter_type
from medadapt.config import Section
from medadapt.errors import ConfigError
from medadapt.losses.drift import DriftLoss

__all__ = ["LINEAR_ADAPTER", "SEARCH_ADAPTOR_ADAPTER", "LinearHead", "LinearHeadConfig", "SearchAdaptorConfig",
           "SearchAdaptorHead", "build_linear_head"]

Route = Literal["all", "query", "document"]
_ROUTE_HELP = ("where the head sits: every input (all), or only the query / document route; on a one-tower "
               "model a route splits it into a Router whose routes share the backbone "
               "(medadapt.adapters.api.split_routes), so the other side stays the frozen model's")


class LinearHeadConfig(Section):
    """A :class:`LinearHead`: ``W e (+ b)``, ``W`` identity-initialised (LlamaIndex / Chroma linear adapter)."""

    kind: Literal["linear"] = "linear"
    route: Route = Field("all", description=_ROUTE_HELP)
    bias: bool = Field(False, description="add a bias vector b (zero-initialised)")


class SearchAdaptorConfig(Section):
    """A :class:`SearchAdaptorHead`: ``e + scale * (W e (+ b))``, ``W`` zero-initialised, with an optional
    training-time L2 pull toward the frozen embedding (Search-Adaptor, Yoon et al. 2024)."""

    kind: Literal["search_adaptor"] = "search_adaptor"
    route: Route = Field("all", description=_ROUTE_HELP)
    bias: bool = Field(False, description="add a bias vector b (zero-initialised)")
    scale: float = Field(1.0, gt=0, description="s in e + s * W e")
    drift_weight: float = Field(0.0, ge=0, description="weight of mean ||normalize(e') - normalize(e)||^2 "
                                "added to the training loss (medadapt.losses.drift; 0: off)")


class _EmbeddingHead(EmbeddingModule):
    """A ``dim`` x ``dim`` ``nn.Linear`` on ``features["sentence_embedding"]``, its weights set by ``init``."""

    def __init__(self, dim: int, bias: bool, init: float) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ConfigError(f"head dim must be a positive integer, got {dim!r}")
        self.dim, self.bias = dim, bool(bias)
        self.linear = nn.Linear(dim, dim, bias=self.bias)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(dim) * init)
            if self.linear.bias is not None:
                self.linear.bias.zero_()

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        features["sentence_embedding"] = self.transform(features["sentence_embedding"])
        return features

    def get_embedding_dimension(self) -> int:
        return self.dim

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={getattr(self, k)}' for k in self.config_keys)})"


class LinearHead(_EmbeddingHead):
    """``e' = W e (+ b)``; ``W = I`` and ``b = 0`` at init."""

    config_keys: list[str] = ["dim", "bias"]

    def __init__(self, dim: int, bias: bool = False) -> None:
        super().__init__(dim, bias, init=1.0)

    def transform(self, v: Tensor) -> Tensor:
        return self.linear(v)


class SearchAdaptorHead(_EmbeddingHead):
    """``e' = e + scale * (W e (+ b))``; ``W = 0`` and ``b = 0`` at init. :meth:`penalty` is the training-time
    pull toward ``e`` (``drift_weight``), added to the loss for the rows the head maps."""

    config_keys: list[str] = ["dim", "bias", "scale", "drift_weight"]

    def __init__(self, dim: int, bias: bool = False, scale: float = 1.0, drift_weight: float = 0.0) -> None:
        super().__init__(dim, bias, init=0.0)
        if not scale > 0:
            raise ConfigError(f"search_adaptor scale must be > 0, got {scale}")
        self.scale, self.drift_weight = float(scale), float(drift_weight)
        self.drift = DriftLoss(self.drift_weight)

    def transform(self, v: Tensor) -> Tensor:
        return v + self.scale * self.linear(v)

    def penalty(self, frozen: Tensor, adapted: Tensor) -> dict[str, Tensor]:
        """The named loss parts this head adds in training: ``{"drift": ...}`` (:class:`DriftLoss`)."""
        return self.drift(frozen, adapted)


def build_linear_head(config: LinearHeadConfig | SearchAdaptorConfig, dim: int) -> LinearHead | SearchAdaptorHead:
    """The head a config describes, for a ``dim``-wide backbone."""
    if isinstance(config, LinearHeadConfig):
        return LinearHead(dim, bias=config.bias)
    if isinstance(config, SearchAdaptorConfig):
        return SearchAdaptorHead(dim, bias=config.bias, scale=config.scale, drift_weight=config.drift_weight)
    raise ConfigError(f"{type(config).__name__} is not a linear head config")


def _from_dict(cls):
    def build(data: dict[str, Any], dim: int):
        data = dict(data)
        saved = data.pop("dim", dim)
        if saved != dim:
            raise ConfigError(f"the saved {cls.__name__} is {saved}-d but the embedding is {dim}-d")
        unknown = sorted(set(data) - set(cls.config_keys))
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} config keys {unknown} (valid: {cls.config_keys})")
        return cls(dim, **data)
    return build


def _parameters(head) -> int:
    return sum(p.numel() for p in head.parameters())


LINEAR_ADAPTER = register_adapter_type(AdapterType(
    name="linear", config_classes=(LinearHeadConfig,), build=build_linear_head, from_dict=_from_dict(LinearHead),
    describe=lambda head: (f"linear head W e{' + b' if head.bias else ''} (identity-initialised, "
                           f"{head.dim}x{head.dim}); {_parameters(head):,} parameters")))

SEARCH_ADAPTOR_ADAPTER = register_adapter_type(AdapterType(
    name="search_adaptor", config_classes=(SearchAdaptorConfig,), build=build_linear_head,
    from_dict=_from_dict(SearchAdaptorHead),
    describe=lambda head: (f"Search-Adaptor head e + {head.scale:g}·(W e{' + b' if head.bias else ''}) "
                           f"(W zero-initialised, drift weight {head.drift_weight:g}); "
                           f"{_parameters(head):,} parameters")))
