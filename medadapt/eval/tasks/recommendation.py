"""Paper recommendation (BMRetriever §4, RELISH): each query article ranks its own graded candidates; full-list
MAP and nDCG, plus ``skipped`` (queries without a relevant candidate), :mod:`medadapt.eval.recommendation`."""

from __future__ import annotations

from pathlib import Path

from medadapt.eval.recommendation import RECOMMENDATION_METRICS, evaluate_recommendation, load_recommendation
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind


@register_task_kind
class RecommendationTask(EvalTask):
    kind = "recommendation"
    default_metrics = RECOMMENDATION_METRICS
    fixed_metrics = "map and ndcg"

    def read(self, path: Path):
        return load_recommendation(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        metrics = evaluate_recommendation(model, self.data, settings.batch_size, settings.show_progress)
        return {self.metadata.query_languages[0]: metrics}
