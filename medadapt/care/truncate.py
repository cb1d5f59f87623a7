"""Matryoshka truncation of the document embedding to the query dimension (CARE §5.1, Appendix C.1.2):
an LLM document tower trained with MRL keeps its first coordinates, so both towers share one space and the index
stays small whatever the document model's width."""

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
    """Keep the first ``dim`` coordinates of ``sentence_embedding`` (no weights; put it before
    ``Normalize``). Embedding-level, so the cache stores the full embedding and truncates on read."""

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
