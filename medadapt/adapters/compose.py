"""Composition as data: which heads and branches go together, checked against one table.

A composed model is a base model plus *components*: heads on the pooled embedding of a route (``"all"``:
every input, ``"query"`` / ``"document"``: one route of an asymmetric ``Router`` model, or of a one-tower
model split into routes that share its backbone) and *branches*
(a second output beside the dense embedding, e.g. HyReC's learned-lexical branch). Recipes describe them
as data (the ``moe`` recipe's ``head.route`` and ``branches``); :func:`check_composition` accepts exactly
the rows of :data:`ALLOWED` and refuses the rest with the reason from :data:`REFUSED` (or the list of what
is allowed), and pairs of components listed in :data:`REFUSED_TOGETHER`.

Branches are registered by the system that provides them (:class:`BranchKind`, entry-point group
``medadapt.branches``); nothing here imports a system.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from medadapt.adapters.types import adapter_types
from medadapt.errors import ConfigError
from medadapt.plugins import load_group, lookup

__all__ = ["ALLOWED", "HEAD", "REFUSED", "REFUSED_TOGETHER", "BranchKind", "base_kind", "branch_kind",
           "branch_kinds", "check_composition", "register_branch"]

#: The component name of every head type (``moe``, ``linear``, ``search_adaptor`` and any other registered
#: :class:`~medadapt.adapters.types.AdapterType`): heads compose alike, whatever they compute.
HEAD = "head"

#: (base, component, where) -> what the combination gives. ``base``: ``dense`` (one tower) or ``asymmetric``
#: (a Router with query and document routes); ``component``: ``head`` (any head type) or a branch kind;
#: ``where``: a route (``all``, ``query``, ``document``) for heads, ``branch`` for branches.
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
    ("dense", "hyrec_lexical", "branch"): "HyReC learned-lexical branch beside the dense embedding (with or "
                                          "without a head on every input): one hybrid model, one index",
    ("asymmetric", "hyrec_lexical", "branch"): "HyReC learned-lexical branch on the document tower: it reads "
                                               "the document tower's token states for queries and documents "
                                               "alike (queries pay one pass through its first layers), the "
                                               "dense side stays the two towers, so the document tower's "
                                               "cached embeddings and any document index stay valid; needs a "
                                               "BERT-like encoder document tower (checked on the model: "
                                               "decoder LLM towers are refused)",
}

#: combinations refused with a specific reason (checked on the whole list of components)
REFUSED: dict[tuple[str, str, str], str] = {}

#: pairs of components refused together on one base, with the reason
REFUSED_TOGETHER: dict[tuple[str, tuple[str, str], tuple[str, str]], str] = {
    ("dense", (HEAD, "query"), ("hyrec_lexical", "branch")):
        "a head on one route of a one-tower model splits it into a Router, and the learned-lexical branch is "
        "composed on the one-tower model; put the head on route all, or start from an asymmetric model",
    ("dense", (HEAD, "document"), ("hyrec_lexical", "branch")):
        "a head on one route of a one-tower model splits it into a Router, and the learned-lexical branch is "
        "composed on the one-tower model; put the head on route all, or start from an asymmetric model",
}


def base_kind(model) -> str:
    """``"asymmetric"`` when ``model``'s first module is a ``Router`` with query and document routes, else
    ``"dense"``."""
    from sentence_transformers.base.modules import Router

    first = next(iter(getattr(model, "_modules", {}).values()), None)
    if isinstance(first, Router) and {"query", "document"} <= set(first.sub_modules):
        return "asymmetric"
    return "dense"


def _component(name: str) -> str:
    """``head`` for a registered head type's name (``moe``, ``linear``, ...), else ``name``."""
    return HEAD if name == HEAD or name in adapter_types() else name


def check_composition(base: str, components: list[tuple[str, str]]) -> None:
    """Raise :class:`~medadapt.errors.ConfigError` unless every ``(component, where)`` is allowed on
    ``base`` (a head type's name counts as ``head``) and no pair of them is in :data:`REFUSED_TOGETHER`.
    This is the table only: a branch kind's ``check`` then looks at the model itself (e.g. the HyReC branch
    on an asymmetric model refuses a document tower that is not a BERT-like encoder)."""
    parts = [(_component(c), w) for c, w in components]
    for (component, where), (named, _) in zip(parts, components):
        key = (base, component, where)
        if key in ALLOWED:
            continue
        reason = REFUSED.get(key)
        allowed = "; ".join(f"{c} on {w} ({b} base)" for (b, c, w) in ALLOWED)
        raise ConfigError(f"cannot compose {named} ({where}) on a {base} base model: "
                          f"{reason or 'not a supported combination'} (allowed: {allowed})")
    for i, first in enumerate(parts):
        for second in parts[i + 1:]:
            reason = REFUSED_TOGETHER.get((base, first, second)) or REFUSED_TOGETHER.get((base, second, first))
            if reason:
                raise ConfigError(f"cannot compose {first[0]} ({first[1]}) with {second[0]} ({second[1]}) on a "
                                  f"{base} base model: {reason}")


@dataclass(frozen=True)
class BranchKind:
    """A branch a system offers.

    Attributes:
        name: the ``kind`` of a ``branches:`` entry (``"hyrec_lexical"``).
        section: the pydantic class that validates the entry.
        build_and_train: ``fn(model, section, recipe, ctx) -> composed model``: adds the branch to the trained
            model (a SentenceTransformer, possibly with heads) and trains it; the result has ``save`` /
            ``save_adapter`` and is what the run evaluates and saves.
        evaluate: ``fn(recipe, model, section, ctx) -> {metric: value}`` for the composed model.
        check: optional ``fn(model, section, recipe)`` run on the loaded base model before any training; raises
            :class:`~medadapt.errors.ConfigError` for a branch that cannot sit on it.
    """

    name: str
    section: type
    build_and_train: Callable[..., Any]
    evaluate: Callable[..., dict[str, float]]
    check: Callable[..., None] | None = None


_BRANCHES: dict[str, BranchKind] = {}
ENTRY_POINT_GROUP = "medadapt.branches"


def register_branch(kind: BranchKind) -> BranchKind:
    _BRANCHES[kind.name] = kind
    return kind


def branch_kinds() -> list[str]:
    load_group(ENTRY_POINT_GROUP, _BRANCHES)
    return sorted(_BRANCHES)


def branch_kind(name: str) -> BranchKind:
    return lookup(ENTRY_POINT_GROUP, _BRANCHES, name, "branch kind")
