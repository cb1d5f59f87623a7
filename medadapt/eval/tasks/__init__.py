"""Evaluation tasks as objects: one file per task kind, each an :class:`EvalTask` subclass registered with
:func:`register_task_kind` (another package's kind registers the same way); :func:`evaluate` scores any model
or index on a loaded task::

    task = task_kind("retrieval").create("medquad").load_data("../shared/data/medquad", "test")
    evaluate(model, task, mode="hybrid").metrics           # {"ndcg@10": ..., ...}
"""

from medadapt.eval.tasks.base import (
    EvalSettings,
    EvalTask,
    TaskMetadata,
    TaskResult,
    evaluate,
    register_task_kind,
    task_kind,
    task_kinds,
    task_prompts,
)

__all__ = ["EvalSettings", "EvalTask", "TaskMetadata", "TaskResult", "evaluate", "register_task_kind", "task_kind",
           "task_kinds", "task_prompts"]
