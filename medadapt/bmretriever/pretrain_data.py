"""Stage I data (BMRetriever §3.2): ``{"anchor", "positive"}`` pairs from unlabelled corpora, title -> text
for titled documents, two disjoint random word spans (Contriever cropping) otherwise. Everything streams, and
each crop is seeded by ``(seed, doc_id)``, so results do not depend on order or process count.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal

from medadapt.bmretriever.sections import BmRetrieverRecipe
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
    "stage1_dataset",
]


@dataclass
class CropConfig:
    """Span lengths in whitespace words, drawn uniformly in ``[min_words, max_words]`` (capped to fit)."""

    min_words: int = 8
    max_words: int = 64

    def __post_init__(self) -> None:
        if self.min_words < 1 or self.max_words < self.min_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {self.min_words}, {self.max_words}")


@dataclass
class CorpusSource:
    """One stage I corpus: a JSONL file, or a BEIR folder or builtin name (its ``corpus.jsonl``). ``mode``:
    ``auto`` (title -> text when titled, else crop), ``title`` (titled records only), ``crop`` (always)."""

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
    for lineno, obj in islice(iter_jsonl(path, "stage I corpus"), source.max_docs):  # streamed, text policy
        if not isinstance(obj.get(source.text_field), str):
            raise DataError(f"{path}:{lineno}: a record needs a string field {source.text_field!r}")
        title = obj.get(source.title_field) or ""
        if not isinstance(title, str):
            raise DataError(f"{path}:{lineno}: field {source.title_field!r} must be a string")
        doc_id = str(obj.get(source.id_field, f"{path.name}:{lineno}"))
        yield doc_id, title.strip(), obj[source.text_field].strip()


def crop_pair(text: str, rng: random.Random, config: CropConfig | None = None) -> tuple[str, str] | None:
    """Two disjoint random word spans of ``text`` (one each side of a random cut), in random order; ``None``
    when it is too short."""
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
    """Yield ``{"anchor", "positive"}`` pairs from every source in turn."""
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
    parts = []
    for s in sources:
        st = s.file.stat() if s.file.is_file() else None
        parts.append([str(s.file), st.st_size if st else None, st.st_mtime_ns if st else None])
    return json.dumps(parts)


def pretrain_dataset(sources: Iterable[CorpusSource], crop: CropConfig | None = None, seed: int = 42,
                     max_pairs: int | None = None):
    """An ``anchor`` / ``positive`` ``Dataset``: streamed into an Arrow file, or a one-pass reservoir sample
    of ``max_pairs``."""
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


def stage1_dataset(recipe: BmRetrieverRecipe):
    """The stage I ``Dataset`` (``anchor`` / ``positive``) the recipe describes."""
    s1 = recipe.stage1
    sources = [CorpusSource(str(recipe.resolve(sec.path)), sec.mode, sec.title_field, sec.text_field,
                            sec.id_field, sec.max_docs) for sec in s1.sources]
    sources = sources or [CorpusSource(str(recipe.resolve(recipe.data.path)))]
    return pretrain_dataset(sources, CropConfig(s1.min_words, s1.max_words), recipe.training.seed,
                            s1.max_pairs)
