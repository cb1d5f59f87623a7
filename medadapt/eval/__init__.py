"""Evaluation as in CMedTEB and CURE: retrieval (nDCG/Recall/MRR/MAP/P/F1/Accuracy@K), rerank MAP@10,
STS Pearson/Spearman; results as a table, JSON and plots. Tasks are objects scored by one
:func:`evaluate` (:mod:`medadapt.eval.tasks`)."""

from medadapt.eval.metrics import ALL_METRICS, DEFAULT_METRICS, evaluate_run, parse_metric, truncate_run
from medadapt.eval.report import plot_results, results_table, write_json
from medadapt.eval.rerank import RERANK_METRICS, evaluate_rerank
from medadapt.eval.retrieval import dense_run, encode_split, evaluate_retrieval
from medadapt.eval.search import exact_search
from medadapt.eval.sts import evaluate_sts

__all__ = [
    "ALL_METRICS",
    "DEFAULT_METRICS",
    "RERANK_METRICS",
    "dense_run",
    "encode_split",
    "evaluate_rerank",
    "evaluate_retrieval",
    "evaluate_run",
    "evaluate_sts",
    "exact_search",
    "parse_metric",
    "plot_results",
    "results_table",
    "truncate_run",
    "write_json",
]

# BMRetriever evaluation tasks (QA, entity linking: pool ranking; paper recommendation).
from medadapt.eval.pool import (  # noqa: E402
    ENTITY_LINKING_METRICS,
    QA_METRICS,
    PoolQuery,
    evaluate_pool,
    load_pool_task,
)
from medadapt.eval.recommendation import (  # noqa: E402
    RECOMMENDATION_METRICS,
    RecommendationQuery,
    evaluate_recommendation,
    load_recommendation,
)

__all__ += [
    "ENTITY_LINKING_METRICS",
    "QA_METRICS",
    "RECOMMENDATION_METRICS",
    "PoolQuery",
    "RecommendationQuery",
    "evaluate_pool",
    "evaluate_recommendation",
    "load_pool_task",
    "load_recommendation",
]

from medadapt.eval.suites import evaluate_suite  # noqa: E402  (suites: cmedteb, cure, bmretriever, medmoe)

__all__ += ["evaluate_suite"]

# Evaluation tasks as objects: one class per task kind, one entry point (medadapt.eval.tasks).
from medadapt.eval.tasks import EvalTask, TaskMetadata, evaluate, task_kind, task_kinds  # noqa: E402

__all__ += ["EvalTask", "TaskMetadata", "evaluate", "task_kind", "task_kinds"]
