"""Composition as data: which heads and branches go together, checked against one table.

A composed model is a base model plus components: heads on the pooled embedding of a route (``all``, ``query``
or ``document``; a one-tower model is split into routes sharing its backbone) and branches (a second output
beside the dense embedding, such as a learned-lexical branch). :func:`check_composition` accepts exactly the rows
of :func:`allowed` and refuses the rest with a reason. Heads compose alike whatever they compute (:data:`ALLOWED`);
a branch is offered by a system (:class:`BranchKind`) and declares its own rows: nothing here names a system.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sentence_transformers.base.modules import Router

from medadapt import systems
from medadapt.adapters.types import adapter_types
from medadapt.errors import ConfigError

__all__ = ["ALLOWED", "HEAD", "REFUSED", "BranchKind", "allowed", "base_kind", "branch_kind", "branch_kinds",
           "check_composition", "refused_together"]

#: The component name of every head type (``linear``, ``search_adaptor`` and any other registered
#: :class:`~medadapt.adapters.types.AdapterType`): heads compose alike, whatever they compute.
HEAD = "head"

#: (base, component, where) -> what the combination gives, for heads. ``base``: ``dense`` (one tower) or
#: ``asymmetric`` (a Router with query and document routes); ``where``: a route (``all``, ``query``,
#: ``document``). Branches add their rows (``where`` = ``branch``) through :class:`BranchKind`.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("dense", HEAD, "all"): "head on the pooled embedding of every input (queries and documents)",
    ("dense", HEAD, "query"): "head on queries only: the one-tower model is split into a Router whose query "
                              "and document routes share the backbone (medadapt.adapters.api.split_routes), "
                              "so documents, their cached embeddings and any document index stay exactly the "
                              "frozen model's",
    ("dense", HEAD, "document"): "head on documents only (the model is split as for query): queries stay the "
                                 "frozen model's, documents are re-indexed through the head from their cached "
                                 "embeddings",
    ("asymmetric", HEAD, "all"): "head after the Router, on both towers' embeddings",
    ("asymmetric", HEAD, "query"): "head on the query route only: the document tower, its cached embeddings "
                                   "and any document index stay valid",
    ("asymmetric", HEAD, "document"): "head on the document route only: documents are re-indexed through the "
                                      "head, which runs on the document tower's cached embeddings (no "
                                      "transformer pass over the corpus when that tower is unchanged)",
}

#: combinations refused with a specific reason (checked on the whole list of components)
REFUSED: dict[tuple[str, str, str], str] = {}


def base_kind(model) -> str:
    """``"asymmetric"`` when ``model``'s first module is a ``Router`` with query and document routes, else
    ``"dense"``."""
    first = next(iter(getattr(model, "_modules", {}).values()), None)
    if isinstance(first, Router) and {"query", "document"} <= set(first.sub_modules):
        return "asymmetric"
    return "dense"


def _component(name: str) -> str:
    """``head`` for a registered head type's name (``moe``, ``linear``, ...), else ``name``."""
    return HEAD if name == HEAD or name in adapter_types() else name


def check_composition(base: str, components: list[tuple[str, str]]) -> None:
    """``ConfigError`` unless every ``(component, where)`` is allowed on ``base`` (a head type counts as ``head``)
    and no pair is in :func:`refused_together`; a branch kind's ``check`` then looks at the model itself."""
    parts = [(_component(c), w) for c, w in components]
    table = allowed()
    for (component, where), (named, _) in zip(parts, components):
        key = (base, component, where)
        if key in table:
            continue
        reason = REFUSED.get(key)
        listed = "; ".join(f"{c} on {w} ({b} base)" for (b, c, w) in table)
        raise ConfigError(f"cannot compose {named} ({where}) on a {base} base model: "
                          f"{reason or 'not a supported combination'} (allowed: {listed})")
    together = refused_together()
    for i, first in enumerate(parts):
        for second in parts[i + 1:]:
            reason = together.get((base, first, second)) or together.get((base, second, first))
            if reason:
                raise ConfigError(f"cannot compose {first[0]} ({first[1]}) with {second[0]} ({second[1]}) on a "
                                  f"{base} base model: {reason}")


@dataclass(frozen=True)
class BranchKind:
    """A branch a system offers: ``name`` (the ``kind`` of a ``branches:`` entry), the pydantic ``section`` that
    validates it, ``build_and_train(model, section, recipe, ctx)`` (adds the branch to the trained model and trains
    it; the result has ``save`` / ``save_adapter`` and is what the run evaluates and saves), ``evaluate(recipe,
    model, section, ctx)``, an optional ``check(model, section, recipe)`` run on the base before any training,
    ``composes_on`` (base -> what the branch gives there) and ``refused_with`` (``(base, (component, where)) ->
    reason``; ``component`` is :data:`HEAD` for any head)."""

    name: str
    section: type
    build_and_train: Callable[..., Any]
    evaluate: Callable[..., dict[str, float]]
    check: Callable[..., None] | None = None
    composes_on: dict[str, str] = field(default_factory=dict)
    refused_with: dict[tuple[str, tuple[str, str]], str] = field(default_factory=dict)


def _branches() -> dict[str, BranchKind]:
    return {b.name: b for s in systems.registered() for b in s.branches}


def allowed() -> dict[tuple[str, str, str], str]:
    """(base, component, where) -> what it gives: :data:`ALLOWED` plus each registered branch's bases."""
    return {**ALLOWED, **{(base, b.name, "branch"): text for b in _branches().values()
                          for base, text in b.composes_on.items()}}


def refused_together() -> dict[tuple[str, tuple[str, str], tuple[str, str]], str]:
    """(base, component, component) -> why the two cannot sit together, from the registered branches."""
    return {(base, other, (b.name, "branch")): reason for b in _branches().values()
            for (base, other), reason in b.refused_with.items()}


def branch_kinds() -> list[str]:
    return sorted(_branches())


def branch_kind(name: str) -> BranchKind:
    found = _branches().get(name)
    if found is None:
        raise ConfigError(f"unknown branch kind {name!r} (valid: {', '.join(branch_kinds()) or 'none'})")
    return found
