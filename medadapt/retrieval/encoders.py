"""What retrieval needs from a model, as small protocols (never a class name, never a system package):
:class:`DenseEncoder` (query / document vectors), :class:`SparseEncoder` (learned ``{term_id: weight}``
vectors), :class:`HybridEncoder` (both in one pass); every :class:`Encoder` has an ``encoder_tag`` and an
``encoder_identity()`` recorded in index manifests.

A ``SentenceTransformer`` is adapted by :class:`SentenceTransformerEncoder` (documents through the
:class:`~medadapt.cache.EmbeddingCache`), unless one of its modules offers the model's encoder itself
(``module.as_encoder(model)``: HyReC's learned-lexical branch), a capability of the loaded model.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol, runtime_checkable

import numpy as np

from medadapt import models
from medadapt.cache import EmbeddingCache, effective_prompt
from medadapt.errors import MedAdaptError
from medadapt.models import model_fingerprint, side_module_refs
from medadapt.progress import encode_with_progress

__all__ = [
    "ST_TAG", "Encoder", "DenseEncoder", "SparseEncoder", "HybridEncoder", "SentenceTransformerEncoder",
    "as_encoder", "open_encoder", "offers_sparse",
]

Role = Literal["query", "document"]
ST_TAG = "sentence-transformers"


# ------------------------------------------------------------------------------------------ protocols
@runtime_checkable
class Encoder(Protocol):
    """Identity of an encoder: its tag (the manifest's ``encoder``) and what identifies its weights. Optional:
    ``fusion_defaults`` (``{"method", "dense_weight"}``: the hybrid fusion it was trained for) and
    ``document_fingerprint()`` (its document side, :mod:`medadapt.retrieval.upgrade`)."""

    encoder_tag: str

    def encoder_identity(self) -> dict[str, Any]:
        """``{"fingerprint": str, ...}`` plus optional ``similarity``, ``max_seq_length``, ``query_prompt``,
        ``document_prompt``."""
        ...


@runtime_checkable
class DenseEncoder(Encoder, Protocol):
    """Texts -> dense vectors whose inner product (after L2 normalisation for ``cosine``) is the score."""

    similarity_fn_name: str

    def encode_query(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray: ...

    def encode_document(self, texts: Sequence[str], *, batch_size: int = 64,
                        show_progress: bool = False) -> np.ndarray: ...


@runtime_checkable
class SparseEncoder(Encoder, Protocol):
    """Texts -> learned sparse vectors ``{term_id: weight}`` with ``0 <= term_id < n_terms``; the lexical
    score is their dot product."""

    n_terms: int

    def encode_lexical(self, texts: Sequence[str], role: Role = "document", *, batch_size: int = 32,
                       show_progress: bool = False) -> list[dict[int, float]]: ...


@runtime_checkable
class HybridEncoder(DenseEncoder, SparseEncoder, Protocol):
    """Dense and sparse, with one pass computing both: ``encode(...) -> (dense or None, sparse or None)``."""

    def encode(self, texts: Sequence[str], role: Role = "document", *, lexical: bool = True, dense: bool = True,
               batch_size: int = 32, show_progress: bool = False, desc: str | None = None
               ) -> tuple[np.ndarray | None, list[dict[int, float]] | None]: ...


# ------------------------------------------------------------------------------------------ adapter
class SentenceTransformerEncoder:
    """A ``SentenceTransformer`` as a :class:`DenseEncoder`: ``encode_query`` / ``encode_document`` (prompts
    and routes apply), documents through ``cache`` (default: the default cache folder, opened on first use)."""

    encoder_tag: ClassVar[str] = ST_TAG

    def __init__(self, model, cache=None):
        self.model = model
        self.cache = cache
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SentenceTransformerEncoder({type(self.model).__name__})"

    @property
    def similarity_fn_name(self) -> str:
        return getattr(self.model, "similarity_fn_name", None) or "cosine"

    @property
    def embedding_dim(self) -> int | None:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return getter()

    def encoder_identity(self) -> dict[str, Any]:
        return {
            "fingerprint": model_fingerprint(self.model),
            "similarity": self.similarity_fn_name,
            "max_seq_length": getattr(self.model, "max_seq_length", None),
            "query_prompt": effective_prompt(self.model, "query"),
            "document_prompt": effective_prompt(self.model, "document"),
        }

    def document_fingerprint(self) -> str:
        """Fingerprint of what ``encode_document`` runs (a ``Router`` model's document route and the modules
        after it, heads included): a query-route head or a CARE query tower keeps the base's."""
        return model_fingerprint(EmbeddingCache.encoder_for(self.model, "document"))

    def encode_query(self, texts: Sequence[str], *, batch_size: int = 64, show_progress: bool = False
                     ) -> np.ndarray:
        emb = encode_with_progress(self.model.encode_query, list(texts), batch_size=batch_size,
                                   convert_to_numpy=True, show_progress=show_progress, desc="encoding queries")
        return np.asarray(emb, dtype=np.float32)

    def encode_document(self, texts: Sequence[str], *, batch_size: int = 64, show_progress: bool = False
                        ) -> np.ndarray:
        if self.cache is None:
            with self._lock:
                if self.cache is None:
                    self.cache = EmbeddingCache()
        return self.cache.encode(self.model, list(texts), role="document", batch_size=batch_size,
                                 show_progress=show_progress)


# ------------------------------------------------------------------------------------------ resolving
def _module_encoder(model):
    """The encoder one of ``model``'s modules offers for it (``module.as_encoder(model)``), or ``None``."""
    for module in getattr(model, "_modules", {}).values():
        make = getattr(module, "as_encoder", None)
        if callable(make):
            return make(model)
    return None


def as_encoder(model, *, cache=None):
    """``model`` as an encoder: an encoder as is; a ``SentenceTransformer`` as the encoder one of its modules
    offers, else wrapped in :class:`SentenceTransformerEncoder`; anything else is a :class:`MedAdaptError`."""
    if isinstance(model, Encoder) and isinstance(model, (DenseEncoder, SparseEncoder)):
        return model
    if callable(getattr(model, "encode_query", None)) and callable(getattr(model, "encode_document", None)):
        return _module_encoder(model) or SentenceTransformerEncoder(model, cache)
    raise MedAdaptError(
        f"{type(model).__name__} cannot be used for retrieval: an encoder offers encode_query / encode_document "
        "(dense) or encode_lexical + n_terms (learned sparse), with encoder_tag and encoder_identity(); a "
        "SentenceTransformer is adapted automatically"
    )


def open_encoder(model, device: str | None = None, *, cache=None):
    """An encoder from an object (see :func:`as_encoder`) or a name (alias, folder, hub id), loaded with
    :func:`medadapt.load`."""
    if isinstance(model, (str, Path)):
        return as_encoder(models.load(str(model), device=device), cache=cache)
    return as_encoder(model, cache=cache)


def offers_sparse(model) -> bool:
    """Whether ``model`` gives learned sparse vectors: a loaded model by its encoder's protocol; a folder,
    before loading it, by the capability of the module classes it names."""
    if not isinstance(model, (str, Path)):
        return isinstance(as_encoder(model), SparseEncoder)
    folder = Path(model).expanduser()
    if not folder.is_dir():
        return False
    refs = [str(e.get("type", "")) for e in side_module_refs(folder)]
    refs += models.module_classes(folder) if (folder / "modules.json").is_file() else []
    for ref in (r for r in refs if r.startswith("medadapt.")):
        try:
            if callable(getattr(models.medadapt_module_class(ref, str(folder)), "as_encoder", None)):
                return True
        except MedAdaptError:  # not a medadapt module class: loading the folder says so
            continue
    return False
