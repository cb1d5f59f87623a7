"""Stage II data: (query, positive, hard negative) groups for instruction fine-tuning (BMRetriever §3.3).

* Labelled BEIR splits: each judged query with each of its positives; the hard negative is **1 random
  passage of the top 100** of a base retriever (the paper uses E5-base; medadapt's default is the frozen
  backbone), mined with :func:`medadapt.curation.mine_hard_negatives` and the ``bmretriever`` preset of
  :class:`~medadapt.curation.MiningConfig` (positives and near-duplicates of them are never sampled).
* FlagEmbedding JSONL training groups (``{query, pos, neg}``, e.g. from ``medadapt data mine``) as they are.
* Synthetic pairs (:mod:`medadapt.bmretriever.synthetic`), consistency-filtered, then mined the same way.

:func:`groups_to_dataset` turns groups into the trainer's columns ``anchor``, ``positive`` (one row per
positive) and ``negative`` (the first hard negative; rows without one are dropped when any row has one, so
the loss sees a fixed number of columns, eq. 3).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from medadapt.bmretriever.instructions import query_prompt
from medadapt.curation import mine_hard_negatives
from medadapt.curation.mining_config import MiningConfig
from medadapt.data.beir import BeirDataset
from medadapt.data.training import TrainingGroup
from medadapt.errors import DataError

__all__ = ["beir_groups", "groups_to_dataset", "subsample_groups"]


def subsample_groups(groups: Sequence[TrainingGroup], max_groups: int | None, seed: int) -> list[TrainingGroup]:
    """A seeded random subset of ``max_groups`` groups, kept in their original order."""
    groups = list(groups)
    if max_groups is None or len(groups) <= max_groups:
        return groups
    keep = sorted(random.Random(seed).sample(range(len(groups)), max_groups))
    return [groups[i] for i in keep]


def beir_groups(data, split: str, searcher, mining: MiningConfig | None = None, *,
                max_queries: int | None = None, seed: int = 42, batch_size: int = 256,
                show_progress: bool = True) -> list[TrainingGroup]:
    """Training groups for the judged queries of a BEIR ``split``, with hard negatives from ``searcher``.

    ``max_queries`` subsamples the queries *before* mining (seeded), so a CPU run searches only those."""
    mining = mining or MiningConfig.preset("bmretriever", seed=seed)
    if split not in data.qrels:
        raise DataError(f"split {split!r} was not loaded (loaded: {', '.join(data.qrels) or 'none'})")
    qrels = data.qrels[split]
    if max_queries is not None and len(qrels) > max_queries:
        keep = set(random.Random(seed).sample(sorted(qrels), max_queries))
        qrels = {q: r for q, r in qrels.items() if q in keep}
        data = BeirDataset(corpus=data.corpus, queries=data.queries, qrels={split: qrels}, root=data.root)
    return mine_hard_negatives(data, split, searcher, mining, batch_size=batch_size,
                               show_progress=show_progress)


def groups_to_dataset(groups: Sequence[TrainingGroup], *, hard_negatives: bool = True,
                      query_template: str | None = None):
    """``datasets.Dataset`` with ``anchor`` / ``positive`` (/ ``negative``) columns, one row per positive.

    With ``query_template``, each group's own ``prompt`` (its task instruction, e.g. task-level synthetic
    data) is applied to its query here (:func:`~medadapt.bmretriever.instructions.query_prompt`); the caller
    then gives this data set no anchor prompt."""
    from datasets import Dataset

    rows: dict[str, list[str]] = {"anchor": [], "positive": [], "negative": []}
    use_neg = hard_negatives and any(g.neg for g in groups)
    for g in groups:
        if use_neg and not g.neg:
            continue
        for p in g.pos:
            prefix = query_prompt(g.prompt or "", query_template) if query_template else ""
            rows["anchor"].append(prefix + g.query)
            rows["positive"].append(p)
            if use_neg:
                rows["negative"].append(g.neg[0])
    if not use_neg:
        del rows["negative"]
    if not rows["anchor"]:
        raise DataError("stage II has no training rows (no groups, or no group with a hard negative)")
    return Dataset.from_dict(rows)
