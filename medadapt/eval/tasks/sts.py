"""STS tasks: ``{"sentence1", "sentence2", "score"}`` rows; Pearson and Spearman of the pair similarities
against the gold scores (cosine by default; an asymmetric model encodes both sentences through one route,
:func:`medadapt.eval.evaluate_sts`)."""

from __future__ import annotations

from pathlib import Path

from medadapt.data.sts import load_sts
from medadapt.errors import MedAdaptError
from medadapt.eval.sts import evaluate_sts
from medadapt.eval.tasks.base import EvalSettings, EvalTask, register_task_kind


@register_task_kind
class StsTask(EvalTask):
    kind = "sts"
    default_metrics = ("pearson", "spearman")
    fixed_metrics = "pearson and spearman"

    def read(self, path: Path):
        return load_sts(path)

    def score(self, model, settings: EvalSettings) -> dict[str, dict[str, float]]:
        try:
            metrics = evaluate_sts(model, self.data, settings.batch_size, settings.show_progress,
                                   similarity=settings.similarity, route=settings.route)
        except ValueError as exc:  # constant gold scores or similarities: the correlation is undefined
            raise MedAdaptError(f"{self.metadata.name} ({self.paths[0]}): {exc}") from None
        return {self.metadata.query_languages[0]: metrics}
