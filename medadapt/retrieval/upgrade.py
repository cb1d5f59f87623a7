"""Swap the query encoder of a built index for a model with the same document encoder, without re-encoding.

A query-route head or a CARE query tower changes only what ``encode_query`` computes, so the document vectors
stay valid. A model whose document side differs (fingerprint, prompt, similarity, dimension) is refused; the
index files are carried over unchanged and checked, and the new manifest records the swap under
``query_upgrades``. See docs/retrieval.md, "Upgrading the query encoder of a built index".
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from medadapt import __version__
from medadapt.errors import MedAdaptError
from medadapt.io import check_output
from medadapt.retrieval.config import RetrieverConfig
from medadapt.retrieval.dense import uses_cosine
from medadapt.retrieval.encoders import DenseEncoder, open_encoder
from medadapt.retrieval.errors import IndexCorruptError, IndexMismatchError
from medadapt.retrieval.retriever import (LOAD_ATTEMPTS, _check_model, _current_config, describe_model,
                                          model_reference)
from medadapt.retrieval.storage import (FORMAT, INDEX_FOLDER, MANIFEST, MANIFEST_SUM, Manifest, ModelInfo,
                                        QueryUpgrade, atomic_dir, check_files, load_manifest, manifest_data,
                                        manifest_digest, write_manifest)
from medadapt.retrieval.vectordb import COMPLETE, META, _label, collection_manifest

__all__ = ["PROBE_QUERY", "UpgradeResult", "upgrade_queries", "upgrade_qdrant_queries"]

#: The one text the new model encodes (as a query) to check its dimension against the index's vectors.
PROBE_QUERY = "query encoder check"


@dataclass(frozen=True)
class UpgradeResult:
    """What an upgrade did: ``target`` (the folder, or ``Qdrant collection 'name'``), the ``old`` and ``new``
    model, the ``document_fingerprint`` both share, ``n_docs`` (none encoded), ``changed`` (``False``: the index
    already named this very model, nothing written) and ``seconds`` (model loading included)."""

    target: str
    old: ModelInfo
    new: ModelInfo
    document_fingerprint: str
    n_docs: int
    changed: bool
    seconds: float


def upgrade_queries(index: str | Path, model: Any, *, model_name: str | None = None, device: str | None = None,
                    verify: bool = True, what: str = "") -> UpgradeResult:
    """Make ``model`` the query encoder of the index folder ``index``, keeping its document vectors.

    Args:
        model: a name for :func:`medadapt.load`, a ``SentenceTransformer`` or an encoder whose document side
            is the index's.
        model_name: recorded so :meth:`Retriever.load <medadapt.retrieval.Retriever.load>` reloads the model
            (default: ``model`` when it is a name; a local folder as its absolute path).
        verify: check every carried file's SHA-256 (sizes are always checked).
        what: how errors name ``index`` (e.g. ``"--index"``).

    Raises:
        IndexMismatchError: another document encoder, document prompt, similarity, dimension or encoder kind.
        IndexCorruptError: the index is damaged.
        MedAdaptError: not an index, no dense side, no recorded document encoder and a recorded model that
            cannot be reloaded to tell, or a model that does not say what its document side is.
        ConfigError: the folder cannot be written (:func:`medadapt.io.check_output`).

    Nothing is changed when an error is raised.
    """
    t0 = time.perf_counter()
    folder = Path(index)
    manifest, _ = load_manifest(folder, verify=False)
    _check_dense(str(folder), manifest)
    check_output(folder, INDEX_FOLDER, what=what)  # a folder that cannot be written: refused before any work
    encoder, info = _open_new(model, model_name, device)
    for _ in range(LOAD_ATTEMPTS):
        manifest, digest = load_manifest(folder, verify=False)
        old, new = _plan(str(folder), manifest, encoder, info, device)
        if new is None:
            return _result(str(folder), manifest, old, new, t0)
        try:
            with atomic_dir(folder, what=what) as tmp:
                _carry(folder, tmp)
                if manifest_digest(folder) != digest:
                    raise _Replaced
                check_files(tmp, manifest, verify, shown=folder)
                write_manifest(tmp, new)
                if manifest_digest(folder) != digest:  # rebuilt meanwhile: that build wins, this one retries
                    raise _Replaced
        except _Replaced:
            continue
        return _result(str(folder), manifest, old, new, t0)
    raise IndexCorruptError(f"{folder}: the index changed while being upgraded ({LOAD_ATTEMPTS} attempts); try "
                            "again when it is no longer being rewritten")


def upgrade_qdrant_queries(client, collection: str, model: Any, *, model_name: str | None = None,
                           device: str | None = None) -> UpgradeResult:
    """:func:`upgrade_queries` for a Qdrant collection written by
    :func:`~medadapt.retrieval.vectordb.export_to_qdrant`: the same checks, then one update of the collection's
    metadata; no point is read or written. Raises as :func:`upgrade_queries`, and for a collection that does not
    exist, was not written by medadapt or whose export did not finish."""
    t0 = time.perf_counter()
    manifest, _ = collection_manifest(client, collection)
    label = _label(collection)
    _check_dense(label, manifest)
    encoder, info = _open_new(model, model_name, device)
    old, new = _plan(label, manifest, encoder, info, device)
    if new is not None:
        client.update_collection(collection, metadata={META: manifest_data(new), COMPLETE: True})
    return _result(label, manifest, old, new, t0)


def _plan(label: str, manifest: Manifest, encoder, info: ModelInfo, device) -> tuple[ModelInfo, Manifest | None]:
    """The index's model record (document side included) and the upgraded manifest (``None``: no change)."""
    _check_dense(label, manifest)
    old = _document_side(label, manifest, lambda: _check_model(Path(label), manifest, None, device, True))
    return old, _checked(label, manifest, old, encoder, info)


def _result(label: str, manifest: Manifest, old: ModelInfo, new: Manifest | None, t0: float) -> UpgradeResult:
    return UpgradeResult(label, old, old if new is None else new.model, old.document_fingerprint,
                         manifest.n_docs, new is not None, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------ checks
class _Replaced(Exception):
    """The index folder was replaced while it was being carried (a concurrent rebuild): try again."""


def _check_dense(label: str, manifest: Manifest) -> None:
    """Only an index with a dense side and a recorded model has a query encoder to swap."""
    if manifest.kind not in ("dense", "hybrid") or manifest.model is None:
        raise MedAdaptError(f"{label} is a {manifest.kind} index without a dense side: it has no query encoder to "
                            "upgrade")


def _open_new(model, model_name: str | None, device: str | None):
    """The new model as an encoder, and what the manifest will record about it (document side included)."""
    encoder = open_encoder(model, device=device)
    name = model_name or (str(model) if isinstance(model, (str, Path)) else "")
    source = None
    if name:
        name, source = model_reference(name)
    if not isinstance(encoder, DenseEncoder):
        raise MedAdaptError(f"{type(encoder).__name__} encodes no dense queries; upgrade-queries needs a dense "
                            "model")
    info = describe_model(encoder, name, source)
    if not info.document_fingerprint:
        raise MedAdaptError(f"{type(encoder).__name__} does not say which document encoder it has (no "
                            "document_fingerprint()); upgrade-queries cannot check that the index's documents "
                            "need no re-encoding: rebuild the index with it")
    return encoder, info


def _document_side(label: str, manifest: Manifest, load_recorded: Callable[[], Any]) -> ModelInfo:
    """The index's model record with its document fingerprint: recorded in the manifest, or (an index built
    before medadapt recorded it) from its recorded model, reloaded and checked against its fingerprint."""
    info = manifest.model
    if info.document_fingerprint:
        return info
    try:
        fingerprint = getattr(load_recorded(), "document_fingerprint", None)
    except MedAdaptError as exc:
        raise MedAdaptError(f"{label} does not record its document encoder (built before medadapt recorded it) "
                            f"and its model cannot be reloaded to tell: {exc}") from None
    if not callable(fingerprint):
        raise MedAdaptError(f"{label} was built with a {manifest.encoder!r} encoder, which does not say which "
                            "document encoder it has; upgrade-queries cannot check its documents: rebuild the "
                            "index with the new model")
    return info.model_copy(update={"document_fingerprint": str(fingerprint())})


def _checked(label: str, manifest: Manifest, old: ModelInfo, encoder, new: ModelInfo) -> Manifest | None:
    """The manifest naming the new model with the upgrade recorded (``None``: the index already names this very
    model); :class:`IndexMismatchError` when its document side or query shape does not fit the index."""
    refuse = "; nothing was changed"
    if encoder.encoder_tag != manifest.encoder:
        raise IndexMismatchError(f"{label} was built with a {manifest.encoder!r} encoder; the new model is a "
                                 f"{encoder.encoder_tag!r} encoder{refuse}")
    if new.document_fingerprint != old.document_fingerprint:
        raise IndexMismatchError(
            f"{label}: the new model's document encoder (fingerprint {new.document_fingerprint}) is not the one its "
            f"documents were encoded with ({old.document_fingerprint}, model {old.name or '(unnamed)'!r}); only a "
            "model trained against the same document encoder (a query-route head, a CARE query tower) can take "
            f"over its queries: rebuild the index with `medadapt index` instead{refuse}")
    if new.document_prompt != old.document_prompt:
        raise IndexMismatchError(f"{label}: the new model's document prompt {new.document_prompt!r} differs from "
                                 f"the one its documents were encoded with ({old.document_prompt!r}){refuse}")
    if uses_cosine(encoder) != bool(manifest.normalized):
        raise IndexMismatchError(f"{label} holds {'normalised' if manifest.normalized else 'raw'} vectors for "
                                 f"{old.similarity} similarity; the new model uses {new.similarity}{refuse}")
    probe = np.asarray(encoder.encode_query([PROBE_QUERY], batch_size=1))
    if probe.ndim != 2 or probe.shape[1] != manifest.embedding_dim:
        raise IndexMismatchError(f"{label} holds {manifest.embedding_dim}-dim vectors; the new model's queries "
                                 f"have shape {list(probe.shape[1:])}{refuse}")
    if new == old:
        return None
    config = RetrieverConfig.model_validate(_current_config(manifest, Path(label)))
    record = QueryUpgrade(old=old, new=new, document_fingerprint=old.document_fingerprint,
                          medadapt_version=__version__,
                          upgraded_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    return manifest.model_copy(update={"format": FORMAT, "config": config.model_dump(mode="json"),
                                       "medadapt_version": __version__, "model": new,
                                       "query_upgrades": [*manifest.query_upgrades, record]})


# ------------------------------------------------------------------------------------------ files
def _link_or_copy(src: str, dst: str) -> str:
    """``dst`` as a hard link to ``src`` (the very bytes, no copy), else a copy (a file system without links)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _carry(folder: Path, tmp: Path) -> None:
    """Every entry of ``folder`` but the manifest and its checksum, into ``tmp`` as it is (links kept)."""
    shutil.copytree(folder, tmp, symlinks=True, copy_function=_link_or_copy, dirs_exist_ok=True,
                    ignore=lambda src, names: {MANIFEST, MANIFEST_SUM} if Path(src) == folder else set())
