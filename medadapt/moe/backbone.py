"""Med-MoE-Embed's backbone / LoRA path as one stage, ``train``, of the one loop: every backbone weight or only a
LoRA adapter's matrices train with the head (if any) through the neutral
:class:`~medadapt.training.steps.TextPairStep` (queries as ``encode_query``, positives and mined hard negatives
as ``encode_document``) and the fast path's InfoNCE. See docs/training.md, "Med-MoE-Embed slow path".

Example:
    >>> stage = backbone_stage(model, text_items(data, pairs, negatives), training, InfoNCESection())
    >>> train(model, [stage], seed=training.seed)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from medadapt.data.beir import BeirDataset
from medadapt.errors import ConfigError
from medadapt.moe.sections import InfoNCESection, MoETrainingSection
from medadapt.training.loop import Stage
from medadapt.training.pairs import TrainingPairs
from medadapt.training.steps import TextPairStep

__all__ = ["STAGE", "backbone_stage", "text_items"]

#: the stage's name in the loss history and ``stage_steps``
STAGE = "train"


def text_items(data: BeirDataset, pairs: TrainingPairs, negatives: np.ndarray | None) -> list[tuple[str, ...]]:
    """One ``(query, positive, negative_1, ..., negative_k)`` tuple of texts per training pair (``negatives``:
    document indices per distinct query, or ``None`` for in-batch negatives only)."""
    texts = data.doc_texts()
    items = []
    for q, d in zip(pairs.pair_query, pairs.pair_doc):
        negs = () if negatives is None else tuple(texts[j] for j in negatives[q])
        items.append((data.queries[pairs.query_ids[q]], texts[d], *negs))
    return items


def backbone_stage(model, items: Sequence[tuple[str, ...]], training: MoETrainingSection,
                   loss: InfoNCESection) -> Stage:
    """The :class:`~medadapt.training.loop.Stage` training every parameter of ``model`` that requires
    gradients (the backbone's, or its LoRA matrices, and the head's) on ``items`` (:func:`text_items`) with
    InfoNCE at ``loss.temperature``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError("the backbone / LoRA path has no trainable parameters")
    if not items:
        raise ConfigError("no training pairs")
    infonce, _ = loss.build()
    step = TextPairStep(model, items, infonce, tasks=("query", "document"))
    return Stage(STAGE, len(items), step, params, training.optim(training.epochs))
