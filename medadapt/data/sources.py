"""Per-source splits of a BEIR folder whose queries carry ``metadata.source`` (MedQuAD's six sites):
:func:`leave_one_source_out` trains on every source but one and evaluates on the held-out one (``test-out``)
beside the usual test (``test-in``). Hand-written: BEIR, MTEB and ``datasets`` split by query list.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from medadapt.data.beir import BeirDataset, Qrels, available_splits, load_qrels, records_by_id
from medadapt.data.builtin import data_folder
from medadapt.data.jsonl import require_file
from medadapt.errors import DataError
from medadapt.io import FolderKind, atomic_write_json, replace_folder
from medadapt.tiny import write_qrels

#: the splits of a fold, in the order they are written
FOLD_SPLITS = ("train", "dev", "test-in", "test-out")


def _root(data: str | Path | BeirDataset) -> Path:
    if isinstance(data, BeirDataset):
        if data.root is None:
            raise DataError("this dataset was not loaded from a folder; pass the BEIR folder instead")
        return Path(data.root)
    return data_folder(data)


def query_sources(data: str | Path | BeirDataset) -> dict[str, str]:
    """Query id -> ``metadata.source`` of every query of ``data`` (a BEIR folder, builtin name or
    :class:`~medadapt.data.BeirDataset` from a folder); a query without one is a :class:`DataError`."""
    def read(obj: dict, path: Path, lineno: int, qid: str) -> str:
        meta = obj.get("metadata")
        source = meta.get("source") if isinstance(meta, dict) else None
        if not isinstance(source, str) or not source.strip():
            raise DataError(f"{path}:{lineno}: query {qid!r} has no metadata.source")
        return source

    return records_by_id(require_file(_root(data) / "queries.jsonl", "queries file"), "queries file", "query",
                         read, "no queries")


def _link(src: Path, dst: Path) -> None:
    """Symlink ``dst`` -> ``src`` (absolute), else hard-link; refuse rather than copy."""
    try:
        os.symlink(src.resolve(), dst)
    except OSError:
        try:
            os.link(src.resolve(), dst)
        except OSError as e:
            raise DataError(f"cannot link {src} into {dst.parent} (symlink and hard link both failed: {e}); "
                            "the fold never copies the data") from None


def leave_one_source_out(root: str | Path, held_out: str, out_dir: str | Path) -> Path:
    """Write the fold of ``root`` that holds out source ``held_out`` into ``out_dir`` (replaced whole).

    ``train`` / ``dev`` / ``test-in``: the other sources' ``train`` / ``dev`` / ``test`` judgements;
    ``test-out``: every judgement of the held-out source (``test``, ``dev`` and ``train``: none is trained
    on; its documents stay in the corpus as candidates). ``fold.json`` records the sources and per-split
    counts. An unknown source, a missing split or an empty fold split is a :class:`DataError`.
    """
    root = data_folder(root)
    out_dir = Path(out_dir)
    sources = query_sources(root)
    names = sorted(set(sources.values()))
    if held_out not in names:
        raise DataError(f"unknown source {held_out!r}; the sources of {root / 'queries.jsonl'} are: "
                        + ", ".join(names))
    have = available_splits(root)
    missing = [s for s in ("train", "dev", "test") if s not in have]
    if missing:
        raise DataError(f"{root / 'qrels'} has no {', '.join(missing)} split (found: {', '.join(have) or 'none'})")
    original = {s: load_qrels(root / "qrels" / f"{s}.tsv") for s in ("train", "dev", "test")}
    for split, qrels in original.items():
        unknown = [q for q in qrels if q not in sources]
        if unknown:
            raise DataError(f"{root / 'qrels' / f'{split}.tsv'}: {len(unknown)} query id(s) not in "
                            f"queries.jsonl, e.g. {unknown[:3]}")

    def part(split: str, inside: bool) -> Qrels:
        return {q: dict(rel) for q, rel in original[split].items() if (sources[q] != held_out) == inside}

    fold: dict[str, Qrels] = {"train": part("train", True), "dev": part("dev", True),
                              "test-in": part("test", True), "test-out": {}}
    for split in ("test", "dev", "train"):
        for q, rel in part(split, False).items():
            fold["test-out"].setdefault(q, {}).update(rel)
    empty = [s for s in FOLD_SPLITS if not fold[s]]
    if empty:
        raise DataError(f"holding out {held_out!r} leaves the fold split(s) {', '.join(empty)} empty")
    counts = {s: {"queries": len(q), "judgements": sum(len(r) for r in q.values()),
                  "per_source": dict(sorted(Counter(sources[x] for x in q).items()))} for s, q in fold.items()}
    with replace_folder(out_dir, FolderKind("a leave-one-source-out fold", ("fold.json",))) as tmp:
        _link(root / "corpus.jsonl", tmp / "corpus.jsonl")
        _link(root / "queries.jsonl", tmp / "queries.jsonl")
        (tmp / "qrels").mkdir()
        for split in FOLD_SPLITS:
            write_qrels(tmp / "qrels" / f"{split}.tsv", fold[split])
        atomic_write_json(tmp / "fold.json", {
            "source_data": str(root.resolve()), "held_out": held_out,
            "train_sources": [n for n in names if n != held_out], "splits": counts})
    return out_dir


def fold_counts(fold_dir: str | Path) -> dict:
    """The ``fold.json`` written by :func:`leave_one_source_out`."""
    path = require_file(Path(fold_dir) / "fold.json", "fold manifest")
    return json.loads(path.read_text(encoding="utf-8"))
