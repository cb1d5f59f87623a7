"""Per-source splits of a BEIR folder whose queries carry ``metadata.source`` (MedQuAD's six sites).

:func:`leave_one_source_out` builds the fold that measures generalisation: train on every source but one and
evaluate on the held-out source's questions (``test-out``) beside the usual test questions (``test-in``).
Hand-written because BEIR, MTEB and ``datasets`` split by query list, not by a metadata field. The fold links
the original ``corpus.jsonl`` / ``queries.jsonl`` and holds its own ``qrels/`` and ``fold.json``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from medadapt.data.beir import BeirDataset, Qrels, available_splits, load_qrels
from medadapt.data.builtin import data_folder
from medadapt.data.jsonl import check_id, field, iter_jsonl, require_file
from medadapt.errors import DataError
from medadapt.io import FolderKind, atomic_open, atomic_write_json, replace_folder

#: the splits of a fold, in the order they are written
FOLD_SPLITS = ("train", "dev", "test-in", "test-out")


def _root(data: str | Path | BeirDataset) -> Path:
    if isinstance(data, BeirDataset):
        if data.root is None:
            raise DataError("this dataset was not loaded from a folder; pass the BEIR folder instead")
        return Path(data.root)
    return data_folder(data)


def query_sources(data: str | Path | BeirDataset) -> dict[str, str]:
    """Query id -> ``metadata.source`` of every query in ``queries.jsonl`` of ``data`` (a BEIR folder, a
    builtin dataset name, or a :class:`~medadapt.data.BeirDataset` loaded from a folder).

    Raises:
        DataError: a query without a non-empty string ``metadata.source`` (named by file and line), or a
            repeated query id.
    """
    path = require_file(_root(data) / "queries.jsonl", "queries file")
    sources: dict[str, str] = {}
    for lineno, obj in iter_jsonl(path, "queries file"):
        qid = check_id(str(field(obj, "_id", (str, int), path, lineno)), "query id", path, lineno)
        meta = obj.get("metadata")
        source = meta.get("source") if isinstance(meta, dict) else None
        if not isinstance(source, str) or not source.strip():
            raise DataError(f"{path}:{lineno}: query {qid!r} has no metadata.source")
        if qid in sources:
            raise DataError(f"{path}:{lineno}: duplicate query id {qid!r}")
        sources[qid] = source
    if not sources:
        raise DataError(f"{path}: no queries")
    return sources


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


def _write_qrels(path: Path, qrels: Qrels) -> None:
    with atomic_open(path, "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, rel in qrels.items():
            for did, grade in rel.items():
                f.write(f"{qid}\t{did}\t{grade}\n")


def leave_one_source_out(root: str | Path, held_out: str, out_dir: str | Path) -> Path:
    """Write the leave-one-source-out fold of ``root`` that holds out source ``held_out`` into ``out_dir``.

    Qrels of the fold (``S`` = the other sources):

    * ``train`` / ``dev``: the ``train`` / ``dev`` judgements of the queries of ``S``;
    * ``test-in``: the ``test`` judgements of the queries of ``S`` (the in-source figure);
    * ``test-out``: every judgement of the held-out source, from its ``test``, ``dev`` **and** ``train``
      qrels: none of its questions is trained or tuned on in this fold, so all of them are unseen (the
      out-of-source figure). Its documents stay in the shared corpus as retrieval candidates, so a model
      that mines hard negatives from the corpus may meet them as negatives, never as positives.

    ``out_dir`` is replaced as a whole (:func:`medadapt.io.replace_folder`); ``corpus.jsonl`` and
    ``queries.jsonl`` are links to the originals. ``out_dir/fold.json`` records the held-out source, the
    training sources and, per split, the number of judged queries in total and per source.

    Raises:
        DataError: ``held_out`` is not a source of the queries (the error lists them), ``root`` lacks a
            ``train`` / ``dev`` / ``test`` qrels file, a judged query has no source, or a fold split would
            be empty. Nothing is written then.
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
            _write_qrels(tmp / "qrels" / f"{split}.tsv", fold[split])
        atomic_write_json(tmp / "fold.json", {
            "source_data": str(root.resolve()), "held_out": held_out,
            "train_sources": [n for n in names if n != held_out], "splits": counts})
    return out_dir


def fold_counts(fold_dir: str | Path) -> dict:
    """The ``fold.json`` written by :func:`leave_one_source_out`."""
    path = require_file(Path(fold_dir) / "fold.json", "fold manifest")
    return json.loads(path.read_text(encoding="utf-8"))
