"""Linear heads: the linear query adapter of LlamaIndex / Chroma, and Search-Adaptor's residual adapter.

* :class:`LinearHead` (``kind: linear``): ``e' = W e (+ b)`` with ``W`` initialised to the identity (and
  ``b`` to zero), a d x d matrix as LlamaIndex's ``EmbeddingAdapterFinetuneEngine`` (``LinearLayer``) and
  Chroma's embedding adapters train. Untrained, it returns the frozen embedding exactly.
* :class:`SearchAdaptorHead` (``kind: search_adaptor``): ``e' = e + s * (W e (+ b))`` with ``W`` (and ``b``)
  initialised to zero (Yoon et al., "Search-Adaptor: Embedding Customization for Information Retrieval",
  ACL 2024), plus an optional L2 pull of ``e'`` toward ``e`` in training
  (:class:`~medadapt.losses.drift.DriftLoss`, weight ``drift_weight``). Untrained, it returns ``e`` exactly.

Both act on the pooled ``features["sentence_embedding"]`` before ``Normalize`` like every medadapt head, so
the embedding cache applies them to cached backbone outputs. Put on the ``query`` route (``route: query``,
or ``add_adapter(config, route="query")``) they adapt queries only and leave documents, their cached
embeddings and any index of them exactly the frozen model's: that is LlamaIndex's setting (the adapter
transforms the query embedding only).

The configs are pydantic sections: the same class is ``model.add_adapter(LinearHeadConfig())`` and a ``moe``
recipe's ``head: {kind: linear}`` (one set of defaults); the width ``dim`` comes from the backbone. The
adapter types ``linear`` and ``search_adaptor`` are registered in :mod:`medadapt.adapters.linear`.
"""

from __future__ import annotations

from typing import Any, Literal

try:
    from typing import Self
except ImportError:  # pragma: no cover - Python < 3.11
    from typing_extensions import Self

import torch
from pydantic import Field
from sentence_transformers.base.modules import Module
from torch import Tensor, nn

from medadapt.config import Section
from medadapt.errors import ConfigError
from medadapt.losses.drift import DriftLoss

__all__ = ["LinearHead", "LinearHeadConfig", "SearchAdaptorConfig", "SearchAdaptorHead", "build_linear_head"]

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


class _EmbeddingHead(Module):
    """Shared plumbing: a ``dim`` x ``dim`` ``nn.Linear`` on ``features["sentence_embedding"]``, saved as a
    sentence-transformers module (``config.json`` + ``model.safetensors``)."""

    operates_on_sentence_embedding: bool = True

    def __init__(self, dim: int, bias: bool) -> None:
        super().__init__()
        if not isinstance(dim, int) or isinstance(dim, bool) or dim < 1:
            raise ConfigError(f"head dim must be a positive integer, got {dim!r}")
        self.dim, self.bias = dim, bool(bias)
        self.linear = nn.Linear(dim, dim, bias=self.bias)

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        features["sentence_embedding"] = self.transform(features["sentence_embedding"])
        return features

    def transform(self, v: Tensor) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def get_embedding_dimension(self) -> int:
        return self.dim

    def get_config_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.config_keys}

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> Self:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        head = cls(**cls.load_config(model_name_or_path, **hub))
        return cls.load_torch_weights(model_name_or_path, model=head, **hub)


class LinearHead(_EmbeddingHead):
    """``e' = W e (+ b)``; ``W = I`` and ``b = 0`` at init, so an untrained head returns ``e`` exactly.

    Example:
        >>> head = LinearHead(384)
        >>> out = head({"sentence_embedding": torch.randn(8, 384)})["sentence_embedding"]
    """

    config_keys: list[str] = ["dim", "bias"]

    def __init__(self, dim: int, bias: bool = False) -> None:
        super().__init__(dim, bias)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(dim))
            if self.linear.bias is not None:
                self.linear.bias.zero_()

    def transform(self, v: Tensor) -> Tensor:
        return self.linear(v)

    def __repr__(self) -> str:
        return f"LinearHead(dim={self.dim}, bias={self.bias})"


class SearchAdaptorHead(_EmbeddingHead):
    """``e' = e + scale * (W e (+ b))``; ``W = 0`` and ``b = 0`` at init, so an untrained head returns ``e``
    exactly. :meth:`penalty` is the training-time pull toward ``e`` (``drift_weight``; the fast path's
    training step adds it to the loss for the rows the head maps).

    Example:
        >>> head = SearchAdaptorHead(384, drift_weight=0.1)
        >>> out = head({"sentence_embedding": torch.randn(8, 384)})["sentence_embedding"]
    """

    config_keys: list[str] = ["dim", "bias", "scale", "drift_weight"]

    def __init__(self, dim: int, bias: bool = False, scale: float = 1.0, drift_weight: float = 0.0) -> None:
        super().__init__(dim, bias)
        if not scale > 0:
            raise ConfigError(f"search_adaptor scale must be > 0, got {scale}")
        self.scale, self.drift_weight = float(scale), float(drift_weight)
        self.drift = DriftLoss(self.drift_weight)
        with torch.no_grad():
            self.linear.weight.zero_()
            if self.linear.bias is not None:
                self.linear.bias.zero_()

    def transform(self, v: Tensor) -> Tensor:
        return v + self.scale * self.linear(v)

    def penalty(self, frozen: Tensor, adapted: Tensor) -> dict[str, Tensor]:
        """The named loss parts this head adds in training: ``{"drift": ...}`` (:class:`DriftLoss`)."""
        return self.drift(frozen, adapted)

    def __repr__(self) -> str:
        return (f"SearchAdaptorHead(dim={self.dim}, bias={self.bias}, scale={self.scale}, "
                f"drift_weight={self.drift_weight})")


def build_linear_head(config: LinearHeadConfig | SearchAdaptorConfig, dim: int) -> LinearHead | SearchAdaptorHead:
    """The head a config describes, for a ``dim``-wide backbone."""
    if isinstance(config, LinearHeadConfig):
        return LinearHead(dim, bias=config.bias)
    if isinstance(config, SearchAdaptorConfig):
        return SearchAdaptorHead(dim, bias=config.bias, scale=config.scale, drift_weight=config.drift_weight)
    raise ConfigError(f"{type(config).__name__} is not a linear head config")
