"""Evaluation tasks as objects: one file per task kind (retrieval, rerank, sts, qa / entity-linking / pool,
recommendation), each registering itself; :func:`evaluate` scores any model or index on a loaded task.

    from medadapt.eval.tasks import evaluate, task_kind
    task = task_kind("retrieval").create("medquad").load_data("../shared/data/medquad", "test")
    evaluate(model, task, mode="hybrid").metrics           # {"ndcg@10": ..., ...}

Adding a kind: a module in this package with an :class:`EvalTask` subclass decorated with
:func:`register_task_kind` (``kind``, ``default_metrics``, ``read`` or ``load`` / ``load_data``, ``score``);
a kind from another package registers the same way when its module is imported.
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
