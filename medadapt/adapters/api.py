"""``SentenceTransformer.add_adapter`` and its companions, extended to medadapt heads.

sentence-transformers forwards ``add_adapter`` / ``set_adapter`` / ``enable_adapters`` /
``disable_adapters`` / ``active_adapters`` / ``load_adapter`` / ``delete_adapter`` /
``get_adapter_state_dict`` to PEFT on the model's transformers backbone, which only knows adapters that
wrap layers *inside* that backbone (LoRA and kin). :func:`medadapt.adapters.methods.install` (run when
:mod:`medadapt.adapters` is imported, which any medadapt head config does) wraps those methods on
``SentenceTransformer`` with the calls here: a medadapt head config (a registered :class:`~medadapt.adapters.types.AdapterType`, e.g. ``MoEConfig``) or a name of
a medadapt head is handled here, anything else goes to the original method, so PEFT LoRA adapters work
exactly as before and both kinds can live in one model.

Where a head sits: on the **pooled sentence embedding**, right before ``Normalize`` (inside an
:class:`~medadapt.adapters.stack.AdapterStack`), or, with ``route="query"`` / ``"document"``, at the end of
that route of an asymmetric (``Router``) model. A one-tower model given a route is first split
(:func:`split_routes`): its backbone modules become both routes of a ``Router`` (the same module objects,
so one set of weights), and the head goes on one route only, e.g. a query-only adapter whose documents stay
exactly the frozen model's embeddings. Semantics follow PEFT / transformers:
``add_adapter`` adds a head and makes it the active one; ``set_adapter(name or [names])`` chooses the
active heads (several run in the given order); ``disable_adapters`` returns the plain backbone output,
``enable_adapters`` turns them back on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from medadapt.adapters.stack import AdapterStack
from medadapt.adapters.types import adapter_type_of
from medadapt.errors import ConfigError
from medadapt.heads.attach import attach

__all__ = ["ALL_ROUTES", "adapter_locations", "adapter_names", "add_adapter", "get_adapter", "shared_backbone",
           "split_routes", "stack_for"]

ALL_ROUTES = "all"
STACK_NAME = "medadapt_adapters"


# ---------------------------------------------------------------------- where the stacks are
def _router(model):
    from sentence_transformers.base.modules import Router

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
    from sentence_transformers.base.modules import Normalize

    return isinstance(module, Normalize) or bool(getattr(module, "operates_on_sentence_embedding", False))


def split_routes(model):
    """Turn the one-tower ``model`` into an asymmetric one, in place, and return its ``Router``: the backbone
    modules (everything before the trailing ``Normalize`` / heads) become both the ``query`` and the
    ``document`` route (``Router.for_query_document``, default route ``document``), as the *same* module
    objects: one set of weights, which ``Router`` saves once and reloads shared. The trailing modules stay
    after the Router. Until a head goes on a route, every output is unchanged; ``encode`` without a task
    takes the document route. A model that already starts with a ``Router`` is returned as it is."""
    from collections import OrderedDict

    from sentence_transformers.base.modules import Router

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
    """For a model made by :func:`split_routes` (a leading ``Router`` whose routes all start with the same
    module objects and add nothing after them but medadapt adapter stacks): the one-tower model's modules
    (the shared backbone, then the modules after the Router), else ``None``. Adapter base fingerprints are
    computed on these, so a head saved from the split model loads onto the plain base and back."""
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
    """The stack at ``route`` (``None`` / ``"all"``: the top level), created on demand (a one-tower model
    is split first for a ``query`` / ``document`` route, :func:`split_routes`)."""
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


# ---------------------------------------------------------------------- the calls
def add_adapter(model, adapter_config: Any, adapter_name: str | None = None, *, route: str | None = None):
    """Add a fresh medadapt head built from ``adapter_config`` as ``adapter_name`` (default ``"default"``)
    and make it the active head (other medadapt heads are deactivated, as in PEFT). Returns the head.

    ``route``: ``None`` puts the head on the pooled embedding before ``Normalize`` (every input);
    ``"query"`` / ``"document"`` puts it at the end of that route only (a one-tower model is split first,
    :func:`split_routes`: the other route is then exactly the frozen model).
    """
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
