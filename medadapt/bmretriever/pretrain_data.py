"""Stage I data: silver (query, passage) pairs from unlabelled corpora (BMRetriever §3.2).

Titled documents give ``(title, text)``; untitled ones two disjoint random word spans (Contriever cropping).
Negatives are in-batch, so a pair is ``{"anchor": query, "positive": passage}``. Everything streams (JSONL line
by line, pairs lazily, an on-disk ``datasets.Dataset``), and each document's crop is seeded by
``(seed, doc_id)``, so results do not depend on order or process count. Hand-written: no library builds
title / crop pairs. See docs/bmretriever.md.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from medadapt.data.builtin import resolve_data_dir
from medadapt.data.jsonl import iter_jsonl
from medadapt.errors import DataError

__all__ = [
    "CorpusSource",
    "CropConfig",
    "crop_pair",
    "iter_corpus",
    "iter_pretrain_pairs",
    "pretrain_dataset",
]


@dataclass
class CropConfig:
    """Span sizes (in whitespace words) for untitled documents.

    Attributes:
        min_words / max_words: each span's length is drawn uniformly in ``[min_words, max_words]`` (capped
            so both spans fit into the document).
    """

    min_words: int = 8
    max_words: int = 64

    def __post_init__(self) -> None:
        if self.min_words < 1 or self.max_words < self.min_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {self.min_words}, {self.max_words}")


@dataclass
class CorpusSource:
    """One corpus for stage I.

    Attributes:
        path: a JSONL file, or a BEIR folder or builtin dataset name (its ``corpus.jsonl`` is read).
        mode: ``auto`` (title -> text when the record has a non-empty title, cropping otherwise), ``title``
            (titled records only; untitled ones are skipped), ``crop`` (always two spans of the text).
        title_field / text_field / id_field: record keys (BEIR: ``title``, ``text``, ``_id``).
        max_docs: read at most this many records.
    """

    path: str | Path
    mode: Literal["auto", "title", "crop"] = "auto"
    title_field: str = "title"
    text_field: str = "text"
    id_field: str = "_id"
    max_docs: int | None = None

    @property
    def file(self) -> Path:
        p = resolve_data_dir(self.path)
        return p / "corpus.jsonl" if p.is_dir() else p


def iter_corpus(source: CorpusSource) -> Iterator[tuple[str, str, str]]:
    """Yield ``(doc_id, title, text)`` from a JSONL corpus, one line at a time (no full load)."""
    path = source.file
    if not path.is_file():
        raise DataError(f"stage I corpus not found: {path}")
    n = 0
    for lineno, obj in iter_jsonl(path, "stage I corpus"):  # the text policy of every loader, streamed
        if source.max_docs is not None and n >= source.max_docs:
            return
        if not isinstance(obj.get(source.text_field), str):
            raise DataError(f"{path}:{lineno}: a record needs a string field {source.text_field!r}")
        title = obj.get(source.title_field) or ""
        if not isinstance(title, str):
            raise DataError(f"{path}:{lineno}: field {source.title_field!r} must be a string")
        doc_id = str(obj.get(source.id_field, f"{path.name}:{lineno}"))
        n += 1
        yield doc_id, title.strip(), obj[source.text_field].strip()


def crop_pair(text: str, rng: random.Random, config: CropConfig | None = None) -> tuple[str, str] | None:
    """Two disjoint random word spans of ``text`` in random order, or ``None`` if it is too short.

    The document is cut at a random point with at least ``min_words`` words on each side; one span is taken
    inside each part (so they never overlap), and the pair is swapped with probability 1/2 so the query is
    not always the earlier span."""
    config = config or CropConfig()
    words = text.split()
    n, lo = len(words), config.min_words
    if n < 2 * lo:
        return None
    cut = rng.randint(lo, n - lo)
    spans = []
    for start, end in ((0, cut), (cut, n)):
        length = rng.randint(lo, min(config.max_words, end - start))
        s = rng.randint(start, end - length)
        spans.append(" ".join(words[s : s + length]))
    if rng.random() < 0.5:
        spans.reverse()
    return spans[0], spans[1]


def iter_pretrain_pairs(sources: Iterable[CorpusSource], crop: CropConfig | None = None,
                        seed: int = 42) -> Iterator[dict[str, str]]:
    """Yield ``{"anchor", "positive"}`` pairs from every source in turn (see module docstring)."""
    crop = crop or CropConfig()
    for source in sources:
        for doc_id, title, text in iter_corpus(source):
            if not text:
                continue
            if source.mode != "crop" and title:
                yield {"anchor": title, "positive": text}
                continue
            if source.mode == "title":
                continue
            pair = crop_pair(text, random.Random(f"{seed}\x00{source.file.name}\x00{doc_id}"), crop)
            if pair is not None:
                yield {"anchor": pair[0], "positive": pair[1]}


def _reservoir(items: Iterator[dict], k: int, seed: int) -> list[dict]:
    """Uniform sample of ``k`` items from a stream in one pass (Algorithm R), kept in stream order."""
    rng = random.Random(seed)
    sample: list[tuple[int, dict]] = []
    for i, item in enumerate(items):
        if i < k:
            sample.append((i, item))
        else:
            j = rng.randint(0, i)
            if j < k:
                sample[j] = (i, item)
    return [item for _, item in sorted(sample, key=lambda t: t[0])]


def _files_stamp(sources: list[CorpusSource]) -> str:
    """Path, size and modification time of every source file, as one string."""
    parts = []
    for s in sources:
        st = s.file.stat() if s.file.is_file() else None
        parts.append([str(s.file), st.st_size if st else None, st.st_mtime_ns if st else None])
    return json.dumps(parts)


def pretrain_dataset(sources: Iterable[CorpusSource], crop: CropConfig | None = None, seed: int = 42,
                     max_pairs: int | None = None):
    """A ``datasets.Dataset`` with ``anchor`` / ``positive`` columns.

    Without ``max_pairs`` the pairs are streamed into an Arrow file (``Dataset.from_generator``); with it, a
    uniform reservoir sample of ``max_pairs`` pairs (one pass, ``O(max_pairs)`` memory)."""
    from datasets import Dataset, Features, Value

    sources = list(sources)
    if not sources:
        raise DataError("stage I needs at least one corpus source")
    features = Features({"anchor": Value("string"), "positive": Value("string")})
    if max_pairs is not None:
        rows = _reservoir(iter_pretrain_pairs(sources, crop, seed), max_pairs, seed)
        if not rows:
            raise DataError("stage I sources gave no pairs")
        return Dataset.from_list(rows, features=features)

    def gen(stamp: str):
        yield from iter_pretrain_pairs(sources, crop, seed)

    # datasets caches generator output by a hash of the function and its arguments: the files' size and
    # modification time go into that hash, so an edited corpus is read again
    ds = Dataset.from_generator(gen, features=features, gen_kwargs={"stamp": _files_stamp(sources)})
    if len(ds) == 0:
        raise DataError("stage I sources gave no pairs")
    return ds
