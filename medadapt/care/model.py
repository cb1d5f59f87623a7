"""Assemble and take apart asymmetric models: an ordinary ``SentenceTransformer`` whose first module is ST's
``Router`` with a ``"query"`` and a ``"document"`` route, followed by one shared ``Normalize``, so
``encode_query`` runs only the small tower and ``encode_document`` only the large one (CARE §4.2) and the
model saves and loads as one folder. Also the towers a CARE recipe names (:func:`build_document_tower`,
:func:`build_query_tower`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Dense, Normalize, Router

from medadapt.care.pruning import prune_layers
from medadapt.care.static import static_from_document
from medadapt.care.truncate import MatryoshkaTruncate
from medadapt.decoder import decoder_tower_modules, strip_normalize
from medadapt.errors import ConfigError
from medadapt.models import load, resolve_model_path

__all__ = [
    "Route",
    "build_asymmetric_model",
    "build_document_tower",
    "build_query_tower",
    "is_asymmetric",
    "route_modules",
    "strip_normalize",
    "tower",
]

Route = Literal["query", "document"]


def _modules_of(tower_or_modules) -> list:
    if hasattr(tower_or_modules, "_modules") and hasattr(tower_or_modules, "encode"):
        return list(tower_or_modules._modules.values())
    return list(tower_or_modules)


def _dim(modules: Sequence) -> int:
    for module in reversed(list(modules)):
        for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
            fn = getattr(module, name, None)
            if callable(fn) and fn() is not None:
                return int(fn())
    raise ConfigError("cannot determine the embedding dimension of a tower")


def build_asymmetric_model(
    query,
    document,
    *,
    projection: bool = False,
    truncate_to: int | Literal["auto"] | None = "auto",
    prompts: dict[str, str] | None = None,
    device: str | None = None,
):
    """The Router-based asymmetric ``SentenceTransformer`` of two towers (models or module lists), whose
    modules are shared, not copied.

    Args:
        projection: HotelMatch variant: a linear ``Dense(query_dim -> document_dim)`` on the query route
            instead of truncating the document embedding (CARE Table-4 discussion).
        truncate_to: without projection, ``"auto"`` appends :class:`~medadapt.care.MatryoshkaTruncate` to the
            document route when it is wider than the query tower; an int forces that width; ``None`` adds
            nothing (dimensions must then match).
    """
    q_modules = strip_normalize(_modules_of(query))
    d_modules = strip_normalize(_modules_of(document))
    q_dim, d_dim = _dim(q_modules), _dim(d_modules)
    if projection:
        q_modules.append(Dense(q_dim, d_dim, bias=True, activation_function=torch.nn.Identity()))
    else:
        target = q_dim if truncate_to == "auto" else truncate_to
        if target is not None and target != d_dim:
            if target > d_dim:
                raise ConfigError(
                    f"the document tower ({d_dim}-d) is narrower than {target}; use projection=True or a wider "
                    "document tower"
                )
            d_modules.append(MatryoshkaTruncate(target))
            d_dim = target
        if q_dim != d_dim:
            raise ConfigError(f"query ({q_dim}-d) and document ({d_dim}-d) embeddings differ; set truncate_to "
                              "or projection=True")
    router = Router.for_query_document(query_modules=q_modules, document_modules=d_modules)
    model = SentenceTransformer(modules=[router, Normalize()], device=device, prompts=dict(prompts or {}),
                                similarity_fn_name="cosine")
    return model


def is_asymmetric(model) -> bool:
    """True if ``model``'s first module is a ``Router`` with query and document routes."""
    first = next(iter(model._modules.values()), None)
    return isinstance(first, Router) and {"query", "document"} <= set(first.sub_modules)


def route_modules(model, route: Route) -> list:
    """The modules of ``model``'s ``route`` (``"query"`` or ``"document"``), in order (shared objects)."""
    if route not in ("query", "document"):
        raise ConfigError(f"route must be 'query' or 'document', got {route!r}")
    if not is_asymmetric(model):
        raise ConfigError("not an asymmetric model: its first module is not a Router with query and "
                          "document routes")
    router = next(iter(model._modules.values()))
    return list(router.sub_modules[route])


def tower(model, route: Route):
    """A ``SentenceTransformer`` *view* of one route plus the modules after the Router, sharing parameters with
    ``model``: it encodes as ``model`` does for that route, and the cache keys it by the route's own modules
    (a document tower cached as a standalone model gets cache hits)."""
    modules = route_modules(model, route) + list(model._modules.values())[1:]
    prompts = {}
    if route in (model.prompts or {}):
        prompts[route] = model.prompts[route]
    view = SentenceTransformer(modules=modules, device=str(model.device), prompts=prompts,
                               similarity_fn_name=model.similarity_fn_name)
    return view


def build_document_tower(spec, device: str | None = None):
    """The standalone (symmetric) document tower of a ``DocumentSection``: ST modules + ``Normalize``."""
    if spec.kind == "decoder":
        kwargs = {"dtype": getattr(torch, spec.torch_dtype)} if spec.torch_dtype else {}
        modules = decoder_tower_modules(resolve_model_path(spec.model), spec.max_seq_length, spec.padding_side,
                                        model_kwargs=kwargs)
        return SentenceTransformer(modules=[*modules, Normalize()], device=device, prompts=dict(spec.prompts))
    model = load(spec.model, device=device)
    if spec.max_seq_length:
        model.max_seq_length = spec.max_seq_length
    if spec.prompts:
        model.prompts = {**(model.prompts or {}), **spec.prompts}
    return model


def build_query_tower(spec, document, texts: list[str] | None = None, device: str | None = None):
    """The query tower of a query section: a sentence-transformers model, a pruned copy of ``document`` or a
    static table distilled from it (token frequencies from ``texts``), ending in ``Normalize``."""
    if spec.kind == "sentence_transformer":
        model = load(spec.model, device=device)
    elif spec.kind == "pruned":
        model = prune_layers(document, spec.layers)
    else:
        static = static_from_document(document, texts, sif_a=spec.sif_a, only_seen_tokens=spec.only_seen_tokens)
        model = SentenceTransformer(modules=[static, Normalize()], device=device)
    if getattr(spec, "max_seq_length", None):
        model.max_seq_length = spec.max_seq_length
    model.prompts = dict(spec.prompts)
    if not isinstance(list(model._modules.values())[-1], Normalize):
        model = SentenceTransformer(modules=[*strip_normalize(model._modules.values()), Normalize()],
                                    device=device, prompts=dict(spec.prompts))
    return model
