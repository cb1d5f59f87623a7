"""Document store of an index: ``docs.jsonl`` (one ``{"_id", "title", "text"}`` per line) and
``docs.offsets.npy`` (``n + 1`` byte offsets), read on demand with ``os.pread`` (thread-safe)."""

from __future__ import annotations

import hashlib
import json
import os
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from medadapt.data.jsonl import check_id, has_bad_id_chars
from medadapt.data.text import check_text
from medadapt.io import atomic_open, atomic_save_npy
from medadapt.retrieval.errors import IndexCorruptError

FILES = ("docs.jsonl", "docs.offsets.npy")


def doc_text(title: str, text: str) -> str:
    """The indexed text: title and text joined by a space (the BEIR / MTEB convention)."""
    return f"{title} {text}".strip() if title else text


class Documents:
    """An in-memory corpus: parallel lists of ids, titles and texts (ids unique)."""

    def __init__(self, ids: Sequence[str], texts: Sequence[str], titles: Sequence[str] | None = None):
        self.ids = [str(i) for i in ids]
        self.texts = list(texts)
        self.titles = list(titles) if titles is not None else [""] * len(self.texts)
        if not (len(self.ids) == len(self.texts) == len(self.titles)):
            raise ValueError("ids, texts and titles must have the same length")
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("document ids must be unique")
        for n, did in enumerate(self.ids, start=1):
            if has_bad_id_chars(did):  # they would split TREC run lines written from this index
                check_id(did, "document id", "documents", n)
        for n, doc in enumerate(zip(self.ids, self.titles, self.texts)):  # lone surrogates crash hashing later
            for what, value in zip(("id", "title", "text"), doc):
                if isinstance(value, str):
                    check_text(value, f"documents[{n}].{what}")

    def __len__(self) -> int:
        return len(self.ids)

    def indexed_texts(self) -> list[str]:
        return [doc_text(t, x) for t, x in zip(self.titles, self.texts)]

    def content_hash(self) -> str:
        return corpus_hash(zip(self.ids, self.titles, self.texts))


def corpus_hash(docs: Iterable[tuple[str, str, str]]) -> str:
    """SHA-256 over ``id, title, text`` of every document, in order."""
    h = hashlib.sha256()
    for did, title, text in docs:
        for part in (did, title, text):
            h.update(part.encode("utf-8"))
            h.update(b"\x00")
    return h.hexdigest()


class DocStore:
    """Read-only access to a saved document store."""

    def __init__(self, folder: str | Path, ids: list[str], offsets: np.ndarray):
        self.path = Path(folder) / "docs.jsonl"
        self.ids = ids
        self.offsets = offsets
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)

    def __len__(self) -> int:
        return len(self.ids)

    def get(self, position: int) -> dict[str, str]:
        start, end = int(self.offsets[position]), int(self.offsets[position + 1])
        raw = os.pread(self._fd, end - start, start)
        try:
            return json.loads(raw)
        except ValueError:
            raise IndexCorruptError(f"{self.path}: document {position} cannot be read") from None

    @staticmethod
    def write(folder: str | Path, docs: Documents) -> None:
        folder = Path(folder)
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        with atomic_open(folder / "docs.jsonl", "wb") as f:
            pos = 0
            for n, (did, title, text) in enumerate(zip(docs.ids, docs.titles, docs.texts)):
                line = (json.dumps({"_id": did, "title": title, "text": text}, ensure_ascii=False) + "\n").encode()
                f.write(line)
                pos += len(line)
                offsets[n + 1] = pos
        atomic_save_npy(folder / "docs.offsets.npy", offsets)

    @classmethod
    def open(cls, folder: str | Path, ids: list[str]) -> DocStore:
        folder = Path(folder)
        try:
            offsets = np.load(folder / "docs.offsets.npy", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise IndexCorruptError(f"{folder / 'docs.offsets.npy'}: cannot read ({exc})") from None
        if offsets.ndim != 1 or len(offsets) != len(ids) + 1:
            raise IndexCorruptError(f"{folder}: document store has {len(offsets) - 1} offsets for {len(ids)} ids")
        return cls(folder, ids, offsets)
