"""The module that holds a model's named heads (:class:`AdapterStack`, before ``Normalize`` or at the end of a
``Router`` route) and the base class of modules on the pooled embedding (:class:`EmbeddingModule`): they read and
write only ``features["sentence_embedding"]``, so the embedding cache runs them on cached backbone outputs.
"""

from __future__ import annotations

from typing import Any

from sentence_transformers.base.modules import Module
from torch import nn

from medadapt.adapters.types import adapter_type
from medadapt.errors import ConfigError, ModelLoadError

__all__ = ["AdapterStack", "EmbeddingModule", "STACK_FORMAT"]

STACK_FORMAT = 1


class EmbeddingModule(Module):
    """A sentence-transformers module that reads and writes only ``features["sentence_embedding"]``, saved as
    ``config.json`` (:meth:`get_config_dict`) and ``model.safetensors``; :meth:`from_config` rebuilds it."""

    operates_on_sentence_embedding: bool = True

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> EmbeddingModule:
        return cls(**config)

    def save(self, output_path: str, *args: Any, safe_serialization: bool = True, **kwargs: Any) -> None:
        self.save_config(output_path)
        self.save_torch_weights(output_path, safe_serialization=safe_serialization)

    @classmethod
    def load(cls, model_name_or_path: str, subfolder: str = "", token: bool | str | None = None,
             cache_folder: str | None = None, revision: str | None = None, local_files_only: bool = False,
             **kwargs: Any) -> EmbeddingModule:
        hub = {"subfolder": subfolder, "token": token, "cache_folder": cache_folder, "revision": revision,
               "local_files_only": local_files_only}
        module = cls.from_config(dict(cls.load_config(model_name_or_path, **hub)))
        return cls.load_torch_weights(model_name_or_path, model=module, **hub)


class AdapterStack(EmbeddingModule):
    """Named heads on a ``dim``-wide embedding; the active ones run in order while ``enabled``. Saved with every
    head's type and config, the active list and the enabled flag; weights under ``heads.<name>.``."""

    config_keys: list[str] = ["dim"]

    def __init__(self, dim: int, adapters: dict[str, dict[str, Any]] | None = None,
                 active: list[str] | None = None, enabled: bool = True) -> None:
        super().__init__()
        self.dim = int(dim)
        self.heads = nn.ModuleDict()
        self.types: dict[str, str] = {}
        for name, spec in (adapters or {}).items():
            kind = adapter_type(spec["type"])
            self.add(name, kind.from_dict(spec["config"], self.dim), kind.name)
        self.active: list[str] = [n for n in (active or []) if n in self.heads]
        self.enabled = bool(enabled)

    def add(self, name: str, head: nn.Module, type_name: str) -> None:
        if name in self.heads:
            raise ConfigError(f"an adapter named {name!r} already exists")
        self.heads[name] = head
        self.types[name] = type_name

    def remove(self, name: str) -> None:
        del self.heads[name]
        del self.types[name]
        self.active = [n for n in self.active if n != name]

    def names(self) -> list[str]:
        return list(self.heads.keys())

    def forward(self, features: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if self.enabled:
            for name in self.active:
                features = self.heads[name](features)
        return features

    def get_embedding_dimension(self) -> int:
        return self.dim

    def spec(self, name: str) -> dict[str, Any]:
        """``{"type", "config"}`` of head ``name`` as saved."""
        kind = adapter_type(self.types[name])
        return {"type": kind.name, "config": kind.config_of(self.heads[name])}

    def get_config_dict(self) -> dict[str, Any]:
        return {"format_version": STACK_FORMAT, "dim": self.dim,
                "adapters": {name: self.spec(name) for name in self.heads},
                "active": list(self.active), "enabled": self.enabled}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AdapterStack:
        version = config.pop("format_version", STACK_FORMAT)
        if version != STACK_FORMAT:
            raise ModelLoadError(f"adapter stack format {version} is not supported (this medadapt reads "
                                 f"{STACK_FORMAT})")
        return cls(**config)

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else "disabled"
        return f"AdapterStack(dim={self.dim}, adapters={self.types}, active={self.active}, {state})"
