"""Assemble and take apart asymmetric (query tower / document tower) SentenceTransformers.

An asymmetric model is an ordinary ``SentenceTransformer`` whose first module is sentence-transformers'
``Router`` with a ``"query"`` and a ``"document"`` route, followed by one shared ``Normalize``::

    SentenceTransformer([Router({"query": [...small tower...],
                                 "document": [...LLM tower..., MatryoshkaTruncate]}),
                         Normalize()])

so ``encode_query`` runs only the small tower and ``encode_document`` only the large one (CARE §4.2,
"Serving"), ``save`` / ``SentenceTransformer(path, trust_remote_code=True)`` round-trip it as one folder, and
ST's trainer can train it with ``router_mapping={"query": "query", "positive": "document", ...}``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from medadapt.care.truncate import MatryoshkaTruncate
from medadapt.decoder import strip_normalize
from medadapt.errors import ConfigError

__all__ = [
    "Route",
    "build_asymmetric_model",
    "is_asymmetric",
    "route_modules",
    "tower",
    "strip_normalize",
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
    """Build the Router-based asymmetric ``SentenceTransformer`` from two towers (models or module lists).

    The towers' modules are *shared*, not copied (training the asymmetric model trains them).

    Args:
        query: the query tower (a SentenceTransformer or its module list): any ST model, a pruned copy of the
            document tower (:func:`~medadapt.care.prune_layers`) or a ``StaticEmbedding``.
        document: the document tower (ST model or modules, e.g. :func:`~medadapt.care.decoder_tower_modules`).
        projection: HotelMatch variant: append a linear ``Dense(query_dim -> document_dim)`` to the query
            route instead of truncating the document embedding (CARE Table-4 discussion).
        truncate_to: without projection, ``"auto"`` appends :class:`~medadapt.care.MatryoshkaTruncate` to the
            document route when the document tower is wider than the query tower; an int forces that width
            on both sides' comparison; ``None`` adds nothing (dimensions must then match).
        prompts: model prompts, e.g. ``{"query": "Instruct: ...\\nQuery: "}``; ``encode_query`` uses
            ``prompts["query"]`` and ``encode_document`` ``prompts["document"]`` when present.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Router
    from torch import nn

    q_modules = strip_normalize(_modules_of(query))
    d_modules = strip_normalize(_modules_of(document))
    q_dim, d_dim = _dim(q_modules), _dim(d_modules)
    if projection:
        q_modules.append(Dense(q_dim, d_dim, bias=True, activation_function=nn.Identity()))
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
    from sentence_transformers.base.modules import Router

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
    """A ``SentenceTransformer`` *view* of one route: the route's modules followed by the modules after the
    Router (``Normalize``), sharing parameters with ``model``. Its ``encode`` is what ``encode_query`` /
    ``encode_document`` of ``model`` returns, and the :class:`~medadapt.cache.EmbeddingCache` keys it by the
    route's own modules, so a document tower that was cached as a standalone model gets cache hits."""
    from sentence_transformers import SentenceTransformer

    modules = route_modules(model, route) + list(model._modules.values())[1:]
    prompts = {}
    if route in (model.prompts or {}):
        prompts[route] = model.prompts[route]
    view = SentenceTransformer(modules=modules, device=str(model.device), prompts=prompts,
                               similarity_fn_name=model.similarity_fn_name)
    return view
