"""Hard-negative mining over a BEIR split with any searcher, into FlagEmbedding training groups (positives:
grade > 0; negatives: :func:`~medadapt.curation.negatives.sample_negatives`). See docs/curation.md."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass

from medadapt.curation.mining_config import MiningConfig
from medadapt.curation.negatives import sample_negatives
from medadapt.curation.search import Searcher, batched_search
from medadapt.curation.textsim import jaccard
from medadapt.data.beir import BeirDataset
from medadapt.data.training import TrainingGroup
from medadapt.errors import DataError


@dataclass
class MiningReport:
    """Counts of queries, groups, negatives and of candidates removed by each guard."""

    queries: int = 0
    no_positive: int = 0
    groups: int = 0
    dropped_empty: int = 0
    negatives: int = 0
    short_groups: int = 0
    excluded_text_duplicates: int = 0
    margin_unavailable: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def query_rng(seed: int, key: str) -> random.Random:
    """A per-query generator, the same for the same ``(seed, key)`` (str seeds hash with SHA-512)."""
    return random.Random(f"{seed}\x00{key}")


def _positive_scores(searcher, texts, pos_ids, hits) -> list[list[float] | None]:
    """Exact positive scores from ``searcher.score`` when offered, else from the hits where retrieved."""
    if callable(getattr(searcher, "score", None)):
        return [list(map(float, s)) for s in searcher.score(texts, pos_ids)]
    out: list[list[float] | None] = []
    for ids, row in zip(pos_ids, hits):
        found = dict(row)
        out.append([found[d] for d in ids] if all(d in found for d in ids) else None)
    return out


def mine_hard_negatives(
    data: BeirDataset,
    split: str,
    searcher: Searcher,
    config: MiningConfig | None = None,
    *,
    batch_size: int = 256,
    show_progress: bool = True,
    report: MiningReport | None = None,
) -> list[TrainingGroup]:
    """One training group per judged query of ``split`` (none for a query without a positive, or without
    a negative under ``config.drop_empty``), deterministic given ``config.seed``. ``searcher``: any
    ``search(query_texts, k)`` over ``data``'s corpus ids; ``report``: filled with counts."""
    config = config or MiningConfig()
    report = report if report is not None else MiningReport()
    qrels = data.qrels.get(split)
    if qrels is None:
        raise DataError(f"split {split!r} was not loaded (loaded: {', '.join(data.qrels) or 'none'})")
    qids, texts, pos_ids = [], [], []
    for qid, rel in qrels.items():
        report.queries += 1
        pos = [d for d, g in rel.items() if g > 0]
        if not pos:
            report.no_positive += 1
            continue
        qids.append(qid)
        texts.append(data.queries[qid])
        pos_ids.append(pos)
    if not qids:
        raise DataError(f"split {split!r} has no query with a positive (grade > 0) document")
    hits = batched_search(searcher, texts, config.depth, batch_size, show_progress, desc="mining")
    need_scores = config.margin is not None or config.absolute_margin is not None or config.with_scores
    pos_scores = _positive_scores(searcher, texts, pos_ids, hits) if need_scores else [None] * len(qids)

    groups: list[TrainingGroup] = []
    for qid, text, pos, row, pscores in zip(qids, texts, pos_ids, hits, pos_scores):
        unknown = [d for d, _ in row[: config.depth] if d not in data.corpus]
        if unknown:
            raise DataError(f"searcher returned document id(s) not in the corpus, e.g. {unknown[:3]}")
        pos_texts = [data.doc_text(d) for d in pos]
        excluded: set[str] = set()
        if config.text_dup_threshold is not None:
            lo, hi = config.window
            for d, _ in row[lo - 1 : hi]:
                text_d = data.doc_text(d)
                if d not in pos and any(jaccard(text_d, p) >= config.text_dup_threshold for p in pos_texts):
                    excluded.add(d)
            report.excluded_text_duplicates += len(excluded)
        use_margin = config.margin is not None or config.absolute_margin is not None
        pos_min = min(pscores) if pscores else None
        if use_margin and pos_min is None:
            report.margin_unavailable += 1
        negs = sample_negatives(
            row, pos, pos_min if use_margin else None, config.window, config.num_negatives,
            query_rng(config.seed, qid), margin=config.margin if pos_min is not None else None,
            excluded_ids=excluded, absolute_margin=config.absolute_margin if pos_min is not None else None,
        )
        if not negs and config.drop_empty:
            report.dropped_empty += 1
            continue
        report.short_groups += len(negs) < config.num_negatives
        report.negatives += len(negs)
        with_scores = config.with_scores and pscores is not None
        groups.append(TrainingGroup(
            query=text,
            pos=pos_texts,
            neg=[data.doc_text(d) for d, _ in negs],
            pos_scores=[round(s, 6) for s in pscores] if with_scores else None,
            neg_scores=[round(s, 6) for _, s in negs] if with_scores else None,
        ))
    report.groups = len(groups)
    return groups
