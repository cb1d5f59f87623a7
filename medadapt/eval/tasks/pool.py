"""Pool-ranking tasks (BMRetriever §4): every query ranks one shared pool of passages, the union of all
lines' ``positives`` and ``negatives`` (:mod:`medadapt.eval.pool`). ``qa`` (BioASQ, PubMedQA, iCliniq:
Recall@5, Recall@20, nDCG@20) and ``entity-linking`` (DrugBank, MeSH: Recall@1, Recall@5, MRR@5) differ in
their default metrics only; ``pool`` is the kind without a family."""

from __future__ import annotations

from pathlib import Path

from medadapt.eval.pool import ENTITY_LINKING_METRICS, QA_METRICS, evaluate_pool, load_pool_task
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind


@register_task_kind
class PoolTask(EvalTask):
    kind = "pool"
    default_metrics = QA_METRICS

    def read(self, path: Path):
        return load_pool_task(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        metrics = evaluate_pool(model, self.data, settings.metrics, settings.batch_size, settings.show_progress)
        return {self.metadata.query_languages[0]: metrics}


@register_task_kind
class QaTask(PoolTask):
    kind = "qa"
    default_metrics = QA_METRICS


@register_task_kind
class EntityLinkingTask(PoolTask):
    kind = "entity-linking"
    default_metrics = ENTITY_LINKING_METRICS
