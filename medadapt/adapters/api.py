"""``SentenceTransformer.add_adapter`` and its companions, extended to medadapt heads (PEFT only knows adapters
*inside* the transformers backbone; :func:`medadapt.adapters.methods.install` dispatches between the two).

A head sits on the pooled embedding right before ``Normalize`` (in an :class:`AdapterStack`) or, with
``route="query"`` / ``"document"``, at the end of that route of a ``Router`` model; a one-tower model is first
split (:func:`split_routes`) into routes sharing its backbone. As in PEFT, ``add_adapter`` adds a head and makes
it the active one, ``set_adapter`` chooses the active heads (run in order), ``disable_adapters`` /
``enable_adapters`` switch them. :func:`attach` / :func:`find_head` are the low-level calls for any module.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, TypeVar

from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Router
from torch import nn

from medadapt.adapters.stack import AdapterStack
from medadapt.adapters.types import adapter_type_of
from medadapt.errors import ConfigError

__all__ = ["ALL_ROUTES", "adapter_locations", "adapter_names", "add_adapter", "attach", "find_head", "get_adapter",
           "shared_backbone", "split_routes", "stack_for"]

ALL_ROUTES = "all"
STACK_NAME = "medadapt_adapters"
DEFAULT_HEAD_NAME = "medadapt_head"
H = TypeVar("H", bound=nn.Module)


def attach(model: SentenceTransformer, head: nn.Module, name: str = DEFAULT_HEAD_NAME) -> SentenceTransformer:
    """Insert ``head`` right before the model's first ``Normalize`` (or at the end), in place; returns ``model``.

    The head sees the raw pooled embedding and its output is still L2-normalised, as heads are trained on cached
    embeddings. Existing module names are kept; the head gets ``name`` (numbered if taken) and moves to the
    model's device. A head reporting ``get_embedding_dimension()`` must match the model's.
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
    """The first module of ``model`` that is a ``cls`` (top level first, then nested, e.g. inside an
    :class:`~medadapt.adapters.stack.AdapterStack`), or ``None``."""
    top = next((m for m in model._modules.values() if isinstance(m, cls)), None)
    return top if top is not None else next((m for m in model.modules() if isinstance(m, cls)), None)


def _router(model):
    first = next(iter(model._modules.values()), None)
    return first if isinstance(first, Router) else None


def _route_dim(modules) -> int | None:
    for module in reversed(list(modules)):
        for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
            fn = getattr(module, name, None)
            if callable(fn):
                try:
                    value = fn()
                except Exception:  # noqa: BLE001 - modules without a fixed width
                    value = None
                if value is not None:
                    return int(value)
    return None


def _embedding_level(module) -> bool:
    """``Normalize`` or a module that reads and writes only the sentence embedding (the rule of
    :func:`medadapt.cache.is_embedding_module`)."""
    return isinstance(module, Normalize) or bool(getattr(module, "operates_on_sentence_embedding", False))


def split_routes(model):
    """Turn the one-tower ``model`` into an asymmetric one, in place, and return its ``Router``: the backbone
    modules (before the trailing ``Normalize`` / heads) become both the ``query`` and the ``document`` route
    (default ``document``) as the *same* module objects, one set of weights that ``Router`` saves once. Outputs
    are unchanged until a head goes on a route. A model already starting with a ``Router`` is returned as is."""
    existing = _router(model)
    if existing is not None:
        return existing
    items = list(model._modules.items())
    i = len(items)
    while i > 0 and _embedding_level(items[i - 1][1]):
        i -= 1
    if i == 0:
        raise ConfigError("cannot split the model into query and document routes: it has no backbone modules")
    backbone = [m for _, m in items[:i]]
    router = Router.for_query_document(query_modules=list(backbone), document_modules=list(backbone))
    name = "0" if all(n != "0" for n, _ in items[i:]) else "router"
    model._modules = OrderedDict([(name, router), *items[i:]])
    return router


def shared_backbone(model) -> list | None:
    """For a model made by :func:`split_routes` (routes sharing the same modules, plus only adapter stacks): the
    one-tower model's modules, else ``None``. Base fingerprints are computed on these, so a head saved from the
    split model loads onto the plain base and back."""
    router = _router(model)
    if router is None or not router.sub_modules:
        return None
    routes = [list(seq) for seq in router.sub_modules.values()]
    shared = [m for m in routes[0] if not isinstance(m, AdapterStack)]
    if not shared:
        return None
    for modules in routes:
        if len(modules) < len(shared) or any(a is not b for a, b in zip(modules, shared)):
            return None
        if not all(isinstance(m, AdapterStack) for m in modules[len(shared):]):
            return None
    return shared + list(model._modules.values())[1:]


def adapter_locations(model) -> Iterator[tuple[str, AdapterStack]]:
    """``(location, stack)`` for every :class:`AdapterStack` of ``model``: ``"all"`` for the top level,
    the route name for one inside a ``Router`` route."""
    for module in model._modules.values():
        if isinstance(module, AdapterStack):
            yield ALL_ROUTES, module
    router = _router(model)
    if router is not None:
        for route, seq in router.sub_modules.items():
            for module in seq:
                if isinstance(module, AdapterStack):
                    yield route, module


def _location_dim(model, location: str) -> int:
    """The embedding width a head at ``location`` (``"all"`` or a route name) reads and writes."""
    if location == ALL_ROUTES:
        dim = model.get_embedding_dimension()
        if dim is None:
            raise ConfigError("cannot add a head: the model does not report its embedding dimension")
        return int(dim)
    router = _router(model)
    if router is None and location in ("query", "document"):  # a one-tower model: split_routes shares it
        return _location_dim(model, ALL_ROUTES)
    if router is None or location not in router.sub_modules:
        routes = [] if router is None else list(router.sub_modules)
        hint = routes or "none; the model has no Router (a one-tower model takes route query or document)"
        raise ConfigError(f"route {location!r} does not exist in this model (routes: {hint})")
    dim = _route_dim(router.sub_modules[location])
    if dim is None:
        raise ConfigError(f"cannot determine the embedding dimension of route {location!r}")
    return dim


def stack_for(model, route: str | None = None, create: bool = False) -> AdapterStack | None:
    """The stack at ``route`` (``None`` / ``"all"``: the top level), created on demand."""
    location = route or ALL_ROUTES
    for where, stack in adapter_locations(model):
        if where == location:
            return stack
    if not create:
        return None
    stack = AdapterStack(_location_dim(model, location))
    if location == ALL_ROUTES:
        attach(model, stack, name=STACK_NAME)
    else:
        split_routes(model).sub_modules[location].append(stack.to(model.device))
    return stack


def adapter_names(model) -> list[str]:
    """Names of every medadapt head in ``model`` (all locations)."""
    return [name for _, stack in adapter_locations(model) for name in stack.names()]


def get_adapter(model, name: str):
    """The head module named ``name`` (a :class:`~medadapt.moe.head.MoEHead`, ...)."""
    for _, stack in adapter_locations(model):
        if name in stack.heads:
            return stack.heads[name]
    raise ConfigError(f"no medadapt adapter named {name!r} (adapters: {adapter_names(model) or 'none'})")


def _peft_loaded(model) -> bool:
    inner = getattr(model, "transformers_model", None)
    return bool(getattr(inner, "_hf_peft_config_loaded", False))


def _peft_names(model) -> list[str]:
    if not _peft_loaded(model):
        return []
    return list(getattr(model.transformers_model, "peft_config", {}) or {})


def add_adapter(model, adapter_config: Any, adapter_name: str | None = None, *, route: str | None = None):
    """Add a fresh head built from ``adapter_config`` as ``adapter_name`` (default ``"default"``) and make it the
    only active head, as in PEFT; returns it. ``route``: ``None`` puts it before ``Normalize`` (every input),
    ``"query"`` / ``"document"`` at the end of that route only (a one-tower model is split first)."""
    kind = adapter_type_of(adapter_config)
    if kind is None:
        raise ConfigError(f"{type(adapter_config).__name__} is not a medadapt head config")
    name = adapter_name or "default"
    if route is None and getattr(adapter_config, "route", "all") != "all":  # a recipe head section's route
        route = adapter_config.route
    if not isinstance(name, str) or not name or "." in name:
        raise ConfigError(f"adapter_name must be a non-empty string without '.', got {name!r}")
    if name in adapter_names(model) or name in _peft_names(model):
        raise ConfigError(f"an adapter named {name!r} already exists; choose another adapter_name")
    if route not in (None, ALL_ROUTES, "query", "document") and _router(model) is None:
        raise ConfigError(f"route={route!r} does not exist in this model: a one-tower model takes route "
                          "'query' or 'document'")
    existing = stack_for(model, route)
    head = kind.build(adapter_config, existing.dim if existing else _location_dim(model, route or ALL_ROUTES))
    head.to(model.device)  # built and checked before the model changes: a bad config leaves it as it was
    stack_for(model, route, create=True).add(name, head, kind.name)
    set_active(model, [name])
    return head


def set_active(model, names: list[str]) -> None:
    """Make exactly ``names`` (medadapt heads) active, each in its stack, in the given order."""
    known = adapter_names(model)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"no medadapt adapter named {unknown} (adapters: {known or 'none'})")
    for _, stack in adapter_locations(model):
        stack.active = [n for n in names if n in stack.heads]
        stack.enabled = True
