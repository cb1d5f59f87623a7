"""Index folders: atomic directory writes, file checksums and the manifest.

A folder is written next to its target under a temporary name and swapped in with ``os.replace``; a
killed ``save`` leaves the previous index (or nothing), never a mix. The manifest lists every file with
its size and SHA-256, so a truncated or edited file is refused on load with one clear error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from medadapt.errors import MedAdaptError
from medadapt.io import atomic_write_json, clean_leftovers, swap_in
from medadapt.retrieval.errors import IndexCorruptError

MANIFEST = "manifest.json"
#: Written by this version. 2: ``config.fusion.dense_weight`` means ``lexical + dense_weight * dense``;
#: 1 (still read): it was the convex share ``w * dense + (1 - w) * lexical`` (converted on load).
FORMAT = 2
READABLE_FORMATS = (1, 2)


class ModelInfo(BaseModel):
    """Identity of the embedding model an index was built with."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    name: str
    fingerprint: str
    similarity: str
    max_seq_length: Optional[int] = None
    query_prompt: str = ""
    document_prompt: str = ""


class FileInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    bytes: int
    sha256: str


class Manifest(BaseModel):
    """``manifest.json`` of an index folder."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
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
    files: dict[str, FileInfo] = {}


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_infos(folder: Path, names: list[str]) -> dict[str, FileInfo]:
    return {n: FileInfo(bytes=(folder / n).stat().st_size, sha256=sha256_file(folder / n)) for n in names}


def write_manifest(folder: Path, manifest: Manifest) -> None:
    atomic_write_json(folder / MANIFEST, manifest.model_dump(mode="json"))


def read_manifest(folder: str | Path, verify: bool = True) -> Manifest:
    """Read and check ``manifest.json``; with ``verify`` also each file's size and SHA-256."""
    folder = Path(folder)
    if not folder.is_dir():
        raise MedAdaptError(f"index folder not found: {folder}")
    path = folder / MANIFEST
    if not path.is_file():
        raise IndexCorruptError(f"{folder}: not a medadapt index (no {MANIFEST})")
    try:
        manifest = Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, ValidationError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise IndexCorruptError(f"{path}: invalid manifest ({first})") from None
    if manifest.format not in READABLE_FORMATS:
        raise IndexCorruptError(f"{path}: index format {manifest.format} is not supported (this medadapt reads "
                                f"{', '.join(map(str, READABLE_FORMATS))})")
    for name, info in manifest.files.items():
        f = folder / name
        if not f.is_file():
            raise IndexCorruptError(f"{folder}: file {name} is missing; rebuild the index")
        if f.stat().st_size != info.bytes:
            raise IndexCorruptError(f"{f}: size {f.stat().st_size} != {info.bytes} recorded; the index is corrupted")
        if verify and sha256_file(f) != info.sha256:
            raise IndexCorruptError(f"{f}: checksum differs from the manifest; the index is corrupted")
    return manifest


@contextlib.contextmanager
def atomic_dir(target: str | Path) -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces ``target`` (an existing index only)."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        raise MedAdaptError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / MANIFEST).is_file():
        raise MedAdaptError(f"{target} exists and is not a medadapt index; refusing to overwrite it")
    target.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(target)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
