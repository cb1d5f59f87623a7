"""Index folders: atomic directory writes, file checksums and the manifest.

A folder is swapped in whole (:func:`medadapt.io.replace_folder`). The manifest lists every file's size and
SHA-256 and is covered by ``manifest.sha256`` (from format 3), so a truncated or edited file is one clear error
on load (corruption, not tampering). See docs/retrieval.md, "Persistence and safety".
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from medadapt.errors import MedAdaptError
from medadapt.identity import sha256_file
from medadapt.io import FolderKind, atomic_open, atomic_write_text, replace_folder
from medadapt.retrieval.errors import IndexCorruptError

MANIFEST = "manifest.json"
#: SHA-256 of ``manifest.json``'s bytes (format 3 on).
MANIFEST_SUM = "manifest.sha256"
#: Written by this version. 3: ``manifest.sha256`` and ``model.source``. 2: ``dense_weight`` means ``lexical +
#: dense_weight * dense``. 1: ``dense_weight`` was a convex share (converted on load).
FORMAT = 3
READABLE_FORMATS = (1, 2, 3)
#: The first format whose folders must have ``manifest.sha256``.
CHECKSUM_FORMAT = 3
#: An index folder (``medadapt index --out``, ``Retriever.save``): an existing non-empty folder is replaced
#: only when it is an index.
INDEX_FOLDER = FolderKind("a medadapt index", (MANIFEST,))


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ModelInfo(_Record):
    """Identity of the embedding model an index was built with."""

    name: str
    fingerprint: str
    similarity: str
    max_seq_length: Optional[int] = None
    query_prompt: str = ""
    document_prompt: str = ""
    #: ``"local"`` (an absolute folder path, never looked up on the hub), ``"alias"``, ``"hub"``, or ``None``
    source: Optional[str] = None
    #: fingerprint of the model's document side: a model with the same one may take over the index's queries
    #: (:mod:`medadapt.retrieval.upgrade`); written only when known
    document_fingerprint: Optional[str] = None


class QueryUpgrade(_Record):
    """One query-encoder swap of an index (:mod:`medadapt.retrieval.upgrade`)."""

    old: ModelInfo
    new: ModelInfo
    document_fingerprint: str
    medadapt_version: str
    #: UTC, ISO 8601 (seconds)
    upgraded_at: str


class FileInfo(_Record):
    bytes: int
    sha256: str


class Manifest(_Record):
    """``manifest.json`` of an index folder."""

    format: int = FORMAT
    medadapt_version: str
    kind: str
    encoder: str = "sentence-transformers"  # the encoder's tag (medadapt.retrieval.encoders), e.g. "hyrec"
    model: Optional[ModelInfo] = None
    embedding_dim: Optional[int] = None
    normalized: Optional[bool] = None
    corpus_hash: str
    n_docs: int
    config: dict[str, Any]
    #: how the dense index was built beyond ``config`` (vectors trained on, seed, source, seconds)
    build: Optional[dict[str, Any]] = None
    files: dict[str, FileInfo] = {}
    #: every query-encoder swap since the documents were encoded, oldest first; written only when there is one
    query_upgrades: list[QueryUpgrade] = []


def file_infos(folder: Path, names: list[str]) -> dict[str, FileInfo]:
    return {n: FileInfo(bytes=(folder / n).stat().st_size, sha256=sha256_file(folder / n)) for n in names}


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` and its checksum ``manifest.sha256`` (each atomically)."""
    text = json.dumps(manifest_data(manifest), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    raw = text.encode("utf-8")
    atomic_write_text(folder / MANIFEST_SUM, f"{hashlib.sha256(raw).hexdigest()}  {MANIFEST}\n")
    with atomic_open(folder / MANIFEST, "wb") as f:
        f.write(raw)


def manifest_data(manifest: Manifest) -> dict[str, Any]:
    """The manifest as JSON data without the optional records it does not hold, so that older readers (which
    refuse unknown keys) can read an index that does not use them."""
    data = manifest.model_dump(mode="json")
    if data.get("build") is None:
        data.pop("build", None)
    if not data.get("query_upgrades"):
        data.pop("query_upgrades", None)
    infos = [data.get("model")] + [u[k] for u in data.get("query_upgrades", []) for k in ("old", "new")]
    for info in infos:
        if isinstance(info, dict) and info.get("document_fingerprint") is None:
            info.pop("document_fingerprint", None)
    return data


def manifest_digest(folder: str | Path) -> str | None:
    """SHA-256 of ``folder/manifest.json``'s bytes now (``None`` when it cannot be read)."""
    try:
        return hashlib.sha256((Path(folder) / MANIFEST).read_bytes()).hexdigest()
    except OSError:
        return None


def _recorded_digest(path: Path) -> str:
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, ValueError) as exc:
        raise IndexCorruptError(f"{path}: cannot read the manifest checksum ({exc})") from None
    parts = text.split()
    digest = parts[0].lower() if parts else ""
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise IndexCorruptError(f"{path}: not a SHA-256 checksum; the index is corrupted")
    return digest


def read_manifest(folder: str | Path, verify: bool = True) -> Manifest:
    return load_manifest(folder, verify)[0]


def load_manifest(folder: str | Path, verify: bool = True) -> tuple[Manifest, str]:
    """The checked manifest (its bytes against ``manifest.sha256`` before parsing; with ``verify`` each file's
    SHA-256, sizes always) and the SHA-256 of the bytes read."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MedAdaptError(f"index folder not found: {folder}")
    path = folder / MANIFEST
    if not path.is_file():
        raise IndexCorruptError(f"{folder}: not a medadapt index (no {MANIFEST})")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise IndexCorruptError(f"{path}: cannot read ({exc.strerror or exc})") from None
    digest = hashlib.sha256(raw).hexdigest()
    sum_path = folder / MANIFEST_SUM
    has_sum = sum_path.is_file()
    if has_sum and _recorded_digest(sum_path) != digest:
        raise IndexCorruptError(f"{path}: checksum differs from {MANIFEST_SUM}; the manifest was modified or "
                                "is corrupted: rebuild the index")
    try:
        manifest = Manifest.model_validate(json.loads(raw.decode("utf-8")))
    except (ValueError, ValidationError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise IndexCorruptError(f"{path}: invalid manifest ({first})") from None
    if manifest.format not in READABLE_FORMATS:
        raise IndexCorruptError(f"{path}: index format {manifest.format} is not supported (this medadapt reads "
                                f"{', '.join(map(str, READABLE_FORMATS))})")
    if not has_sum and manifest.format >= CHECKSUM_FORMAT:
        raise IndexCorruptError(f"{folder}: {MANIFEST_SUM} is missing (index format {manifest.format} has one); "
                                "the index is corrupted: rebuild it")
    check_files(folder, manifest, verify)
    return manifest, digest


def check_files(root: Path, manifest: Manifest, verify: bool, shown: Path | None = None) -> None:
    """The files under ``root`` are the ones ``manifest`` records (inside the folder, present, of the recorded
    size and, with ``verify``, SHA-256), else :class:`IndexCorruptError` naming ``shown`` (default ``root``)."""
    shown = Path(shown or root)
    for name, info in manifest.files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise IndexCorruptError(f"{shown / MANIFEST}: file name {name!r} points outside the index folder")
        f = Path(root) / name
        if not f.is_file():
            raise IndexCorruptError(f"{shown}: file {name} is missing; rebuild the index")
        size = f.stat().st_size
        if size != info.bytes:
            raise IndexCorruptError(f"{shown / name}: differs from the manifest (size {size} != {info.bytes} "
                                    "recorded); the index is corrupted: rebuild it")
        if verify and sha256_file(f) != info.sha256:
            raise IndexCorruptError(f"{shown / name}: differs from the manifest (checksum); the index is "
                                    "corrupted: rebuild it")


@contextlib.contextmanager
def atomic_dir(target: str | Path, what: str = "") -> Iterator[Path]:
    """Yield a fresh temporary folder that replaces ``target`` on success (:func:`medadapt.io.replace_folder`
    with :data:`INDEX_FOLDER`: only an existing index is replaced)."""
    with replace_folder(target, INDEX_FOLDER, what=what) as tmp:
        yield tmp
