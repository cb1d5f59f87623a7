"""BEIR-layout retrieval data: ``corpus.jsonl``, ``queries.jsonl`` and ``qrels/<split>.tsv``.

Qrels are integer grades; grades <= 0 count as non-relevant (TREC's -2 for junk is accepted). Ids may not
hold whitespace or control characters (they would split or forge TREC run lines).
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field as dc_field
from pathlib import Path

from medadapt.data.builtin import data_folder, resolve_data_dir
from medadapt.data.jsonl import MAX_GRADE, check_id, field, iter_jsonl, iter_lines, require_file
from medadapt.errors import DataError

Qrels = dict[str, dict[str, int]]

_SPLIT_NAME = re.compile(r"[^\W_][\w.-]{0,99}")


def check_split(split: str) -> str:
    """``split`` if it is a plain name that stays inside the data folder (never a path), else a
    :class:`DataError`."""
    if not isinstance(split, str) or not _SPLIT_NAME.fullmatch(split):
        shown = repr(split) if not isinstance(split, str) or len(split) <= 100 else f"{split[:100]!r}..."
        raise DataError(f"split {shown} is not a split name: use a plain name such as 'test' or 'dev' (letters, "
                        "digits, '.', '-', '_', starting with a letter or digit, at most 100 characters; no path)")
    return split


@dataclass
class BeirDataset:
    """A loaded BEIR folder: ``corpus`` (doc id -> ``{"title", "text"}``, file order), ``queries``,
    ``qrels`` (split -> ``{query_id: {doc_id: grade}}``, the splits loaded) and its ``root``."""

    corpus: dict[str, dict[str, str]]
    queries: dict[str, str]
    qrels: dict[str, Qrels] = dc_field(default_factory=dict)
    root: Path | None = None

    def doc_text(self, doc_id: str) -> str:
        """Title and text joined by a space (the BEIR / MTEB convention); the text alone if untitled."""
        doc = self.corpus[doc_id]
        title = doc.get("title") or ""
        return f"{title} {doc['text']}".strip() if title else doc["text"]

    @property
    def doc_ids(self) -> list[str]:
        return list(self.corpus)

    def doc_texts(self) -> list[str]:
        return [self.doc_text(d) for d in self.corpus]

    def split_queries(self, split: str) -> dict[str, str]:
        """The queries judged in ``split`` (in qrels order)."""
        if split not in self.qrels:
            raise DataError(f"split {split!r} was not loaded (loaded: {', '.join(self.qrels) or 'none'})")
        return {qid: self.queries[qid] for qid in self.qrels[split]}


def available_splits(root: str | Path) -> list[str]:
    qdir = resolve_data_dir(root) / "qrels"
    return sorted(p.stem for p in qdir.glob("*.tsv")) if qdir.is_dir() else []


def load_corpus(path: str | Path) -> dict[str, dict[str, str]]:
    """Doc id -> ``{"title", "text"}``, in file order."""
    def read(obj: dict, path: Path, lineno: int, doc_id: str) -> dict[str, str]:
        text = field(obj, "text", str, path, lineno)
        return {"title": field(obj, "title", str, path, lineno, required=False) or "", "text": text}

    return records_by_id(path, "corpus file", "document", read, "corpus is empty")


def load_queries(path: str | Path) -> dict[str, str]:
    """Query id -> text; an empty or blank query text is refused (it retrieves nothing and scores 0)."""
    def read(obj: dict, path: Path, lineno: int, qid: str) -> str:
        text = field(obj, "text", str, path, lineno)
        if not text.strip():
            raise DataError(f"{path}:{lineno}: query {qid!r} has an empty text")
        return text

    return records_by_id(path, "queries file", "query", read, "no queries")


def records_by_id(path: str | Path, what: str, kind: str, read, empty: str) -> dict:
    """``{_id: read(obj, path, lineno, _id)}`` of a JSONL file of records with ``_id`` (checked ids); a
    repeated id or no record is a :class:`DataError` (``empty``: its message)."""
    path = Path(path)
    out: dict = {}
    for lineno, obj in iter_jsonl(path, what):
        rid = check_id(str(field(obj, "_id", (str, int), path, lineno)), f"{kind} id", path, lineno)
        value = read(obj, path, lineno, rid)
        if rid in out:
            raise DataError(f"{path}:{lineno}: duplicate {kind} id {rid!r}")
        out[rid] = value
    if not out:
        raise DataError(f"{path}: {empty}")
    return out


def load_qrels(path: str | Path) -> Qrels:
    """Read a BEIR qrels TSV (``query-id  corpus-id  score``, header optional): integer grades up to
    :data:`~medadapt.data.jsonl.MAX_GRADE`; a pair judged twice with two different grades is refused."""
    path = require_file(path, "qrels file")
    qrels: Qrels = {}
    for lineno, line in iter_lines(path, "qrels file"):
        row = next(csv.reader([line], delimiter="\t"), [])
        if not row or not "".join(row).strip():
            continue
        if lineno == 1 and row[0].strip().lower() in ("query-id", "query_id", "qid"):
            continue
        if len(row) < 3:
            raise DataError(f"{path}:{lineno}: expected 3 tab-separated columns, got {len(row)}")
        qid, did, score = row[0].strip(), row[1].strip(), row[2].strip()
        check_id(qid, "query id", path, lineno)
        check_id(did, "document id", path, lineno)
        grade = _grade(score, path, lineno)
        if grade > MAX_GRADE:
            raise DataError(f"{path}:{lineno}: relevance grade {grade} is above {MAX_GRADE}")
        judged = qrels.setdefault(qid, {})
        if judged.get(did, grade) != grade:
            raise DataError(f"{path}:{lineno}: query {qid!r} document {did!r} is graded {grade} here and "
                            f"{judged[did]} on line {_first_line(path, qid, did)}")
        judged[did] = grade
    if not qrels:
        raise DataError(f"{path}: qrels file has no judgements")
    return qrels


def _first_line(path: Path, qid: str, did: str) -> int:
    """The line of ``path`` that first judges ``(qid, did)`` (for the conflicting-grade error only)."""
    for lineno, line in iter_lines(path, "qrels file"):
        row = next(csv.reader([line], delimiter="\t"), [])
        if len(row) >= 3 and row[0].strip() == qid and row[1].strip() == did:
            return lineno
    return 0


def _grade(score: str, path: Path, lineno: int) -> int:
    """``"2"`` / ``"2.0"`` -> 2; anything else (``"1.5"``, ``"nan"``, ``"x"``) is a :class:`DataError`."""
    try:
        return int(score)
    except ValueError:
        pass
    try:
        value = float(score)
    except ValueError:
        raise DataError(f"{path}:{lineno}: relevance score {score!r} is not a number") from None
    if not math.isfinite(value) or not value.is_integer():
        raise DataError(f"{path}:{lineno}: relevance score {score!r} is not an integer grade")
    return int(value)


def load_beir(root: str | Path, splits: list[str] | str | None = None) -> BeirDataset:
    """Load a BEIR folder (or a builtin dataset name such as ``"medmini"``) with the qrels of ``splits``
    (``"test"``, ``["train", "dev"]``; ``None``: every split found). Any problem (an unknown name, missing
    files, malformed lines, qrels ids in no corpus / queries file) is a :class:`DataError`."""
    if isinstance(splits, str):
        splits = [splits]
    for split in splits or ():
        check_split(split)
    root = data_folder(root)
    corpus = load_corpus(require_file(root / "corpus.jsonl", "corpus file"))
    queries = load_queries(require_file(root / "queries.jsonl", "queries file"))
    if splits is None:
        splits = available_splits(root)
        if not splits:
            raise DataError(f"no qrels found in {root / 'qrels'}")
    data = BeirDataset(corpus=corpus, queries=queries, root=root)
    for split in splits:
        qpath = root / "qrels" / f"{split}.tsv"
        if not qpath.is_file():
            have = ", ".join(available_splits(root)) or "none"
            raise DataError(f"qrels file not found: {qpath} (available splits: {have})")
        qrels = load_qrels(qpath)
        missing_q = [q for q in qrels if q not in queries]
        missing_d = sorted({d for rel in qrels.values() for d in rel if d not in corpus})
        if missing_q:
            raise DataError(
                f"{qpath}: {len(missing_q)} query id(s) not in queries.jsonl, e.g. {missing_q[:3]}"
            )
        if missing_d:
            raise DataError(f"{qpath}: {len(missing_d)} document id(s) not in corpus.jsonl, e.g. {missing_d[:3]}")
        data.qrels[split] = qrels
    return data


def merge_beir(parts: dict[str, BeirDataset]) -> BeirDataset:
    """One dataset from several (``{"medquad": ..., "questiondoctors": ...}``, e.g. ``data.mix``): the union
    of corpora, queries and the splits every part loaded, each id prefixed ``"<name>/"`` (its domain,
    :func:`domain_of`)."""
    if not parts:
        raise DataError("merge_beir needs at least one dataset")
    for name in parts:
        if not name or "/" in name or any(c.isspace() for c in name):
            raise DataError(f"dataset name {name!r} for merge_beir must be non-empty, without '/' or spaces")
    splits = set.intersection(*(set(d.qrels) for d in parts.values()))
    merged = BeirDataset(corpus={}, queries={})
    for name, data in parts.items():
        merged.corpus.update({f"{name}/{d}": doc for d, doc in data.corpus.items()})
        merged.queries.update({f"{name}/{q}": text for q, text in data.queries.items()})
        for split in sorted(splits):
            merged.qrels.setdefault(split, {}).update(
                {f"{name}/{q}": {f"{name}/{d}": g for d, g in rel.items()} for q, rel in data.qrels[split].items()})
    return merged


def domain_of(merged_id: str) -> str:
    """The set a :func:`merge_beir` id came from (``"questiondoctors/Q12" -> "questiondoctors"``)."""
    return merged_id.split("/", 1)[0]
