"""Evaluation as in CMedTEB, CURE, BMRetriever and Med-MoE-Embed: retrieval, rerank, STS, QA, entity linking
and paper recommendation metrics (pytrec_eval); results as a table, JSON and plots. Tasks are objects scored
by one :func:`evaluate` (:mod:`medadapt.eval.tasks`); suites are lists of them (:mod:`medadapt.eval.suites`)."""

from medadapt.eval.metrics import ALL_METRICS, DEFAULT_METRICS, evaluate_run, parse_metric, truncate_run
from medadapt.eval.report import plot_results, results_table, write_json
from medadapt.eval.retrieval import dense_run, encode_split, evaluate_retrieval
from medadapt.eval.search import exact_search
from medadapt.eval.suites import evaluate_suite
from medadapt.eval.tasks import EvalTask, TaskMetadata, evaluate, task_kind, task_kinds
from medadapt.eval.tasks.pool import (
    ENTITY_LINKING_METRICS,
    QA_METRICS,
    PoolQuery,
    evaluate_pool,
    load_pool_task,
)
from medadapt.eval.tasks.recommendation import (
    RECOMMENDATION_METRICS,
    RecommendationQuery,
    evaluate_recommendation,
    load_recommendation,
)
from medadapt.eval.tasks.rerank import RERANK_METRICS, evaluate_rerank
from medadapt.eval.tasks.sts import evaluate_sts

__all__ = [
    "ALL_METRICS", "DEFAULT_METRICS", "ENTITY_LINKING_METRICS", "QA_METRICS", "RECOMMENDATION_METRICS",
    "RERANK_METRICS", "EvalTask", "PoolQuery", "RecommendationQuery", "TaskMetadata", "dense_run", "encode_split",
    "evaluate", "evaluate_pool", "evaluate_recommendation", "evaluate_rerank", "evaluate_retrieval",
    "evaluate_run", "evaluate_sts", "evaluate_suite", "exact_search", "load_pool_task", "load_recommendation",
    "parse_metric", "plot_results", "results_table", "task_kind", "task_kinds", "truncate_run", "write_json",
]
