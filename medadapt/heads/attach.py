"""Insert a head into a ``SentenceTransformer`` pipeline and find it again."""

from __future__ import annotations

from collections import OrderedDict
from typing import TypeVar

from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules.normalize import Normalize
from torch import nn

__all__ = ["attach", "find_head"]

H = TypeVar("H", bound=nn.Module)

DEFAULT_HEAD_NAME = "medadapt_head"


def attach(model: SentenceTransformer, head: nn.Module, name: str = DEFAULT_HEAD_NAME) -> SentenceTransformer:
    """Insert ``head`` right before the model's first ``Normalize`` module (or append it if there is none),
    in place, and return ``model``.

    Placing it before ``Normalize`` means the head sees the raw pooled embedding and its output is still
    L2-normalised, matching how heads are trained on cached embeddings. The head is moved to the model's
    device. Existing module names are kept (so per-module kwargs stay attached to the right module); the head
    gets ``name``, suffixed with a number if taken. If the head reports ``get_embedding_dimension()``, it must
    match the model's.
    """
    model_dim = model.get_embedding_dimension()
    head_dim = head.get_embedding_dimension() if hasattr(head, "get_embedding_dimension") else None
    if model_dim is not None and head_dim is not None and model_dim != head_dim:
        raise ValueError(f"head dimension {head_dim} != model embedding dimension {model_dim}")
    modules = list(model._modules.items())
    position = next((i for i, (_, m) in enumerate(modules) if isinstance(m, Normalize)), len(modules))
    unique, suffix = name, 1
    while unique in model._modules:
        unique, suffix = f"{name}_{suffix}", suffix + 1
    modules.insert(position, (unique, head.to(model.device)))
    model._modules = OrderedDict(modules)
    return model


def find_head(model: SentenceTransformer, cls: type[H]) -> H | None:
    """The first module of ``model`` (top level first, then nested, e.g. a head added with
    ``model.add_adapter`` inside its :class:`~medadapt.adapters.stack.AdapterStack`) that is an instance of
    ``cls``, or ``None``."""
    top = next((m for m in model._modules.values() if isinstance(m, cls)), None)
    return top if top is not None else next((m for m in model.modules() if isinstance(m, cls)), None)
