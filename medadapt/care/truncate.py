"""Matryoshka truncation of the document embedding to the query dimension (CARE §5.1, Appendix C.1.2).

CARE's LLM document towers emit 2560/4096-d embeddings; trained with MRL
(:class:`~medadapt.losses.MatryoshkaLoss`) their first 768 coordinates are a good embedding, so the
document route keeps exactly those and query and document vectors live in one 768-d space (the index
stays 768-d whatever the document model's size).
"""

from __future__ import annotations

from typing import Any

try:
    from typing import Self
except ImportError:  # pragma: no cover - Python < 3.11
    from typing_extensions import Self

from sentence_transformers.base.modules import Module
from torch import Tensor

from medadapt.errors import ConfigError

__all__ = ["MatryoshkaTruncate"]


class MatryoshkaTruncate(Module):
    """Keep the first ``dim`` coordinates of ``features["sentence_embedding"]`` (no weights).

    Embedding-level (``operates_on_sentence_embedding``), so the :class:`~medadapt.cache.EmbeddingCache`
    stores the *full* document embedding and truncates on read: one corpus encode serves every MRL width.
    Put it before ``Normalize`` (re-normalise after truncation).

    Example:
        >>> MatryoshkaTruncate(768)({"sentence_embedding": torch.randn(2, 2560)})["sentence_embedding"].shape
        torch.Size([2, 768])
    """

    config_keys: list[str] = ["dim"]
    operates_on_sentence_embedding: bool = True

    def __init__(self, dim: int) -> None:
        super().__init__()
        if int(dim) < 1:
            raise ConfigError(f"MatryoshkaTruncate dim must be >= 1, got {dim}")
        self.dim = int(dim)

    def forward(self, features: dict[str, Tensor | Any], **kwargs: Any) -> dict[str, Tensor | Any]:
        emb = features["sentence_embedding"]
        if emb.shape[-1] < self.dim:
            raise ValueError(f"cannot truncate a {emb.shape[-1]}-d embedding to {self.dim} dimensions")
        features["sentence_embedding"] = emb[..., : self.dim]
        return features

    def get_embedding_dimension(self) -> int:
        return self.dim

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> Self:
        config = cls.load_config(model_name_or_path, subfolder=subfolder, token=token,
                                 cache_folder=cache_folder, revision=revision,
                                 local_files_only=local_files_only)
        return cls(**config)

    def __repr__(self) -> str:
        return f"MatryoshkaTruncate(dim={self.dim})"
