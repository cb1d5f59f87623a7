"""BMRetriever's two training stages as :class:`~medadapt.training.loop.Stage` objects of the one loop.

Both minimise dot-product InfoNCE at temperature ``τ`` (paper: 1) over in-batch negatives (stage I, eq. 2) or
in-batch + hard negatives (stage II, eq. 3) of the global batch, with GradCache accumulation. Instructions are
prompts per data set and column; several data sets train one data set per batch, drawn in proportion to size
(:class:`~medadapt.training.steps.DatasetBatches`). Fractional ``epochs`` / ``warmup_steps`` map onto the loop's
section (:func:`loop_optim`). See docs/bmretriever.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torch import nn

from medadapt.bmretriever.schema import BmStageSection
from medadapt.errors import ConfigError
from medadapt.losses.infonce import InfoNCELoss
from medadapt.training.config import OptimSection
from medadapt.training.loop import LoopResult, Stage, train
from medadapt.training.steps import DatasetBatches, TextPairStep, TextRows

__all__ = ["contrastive_stage", "logged_rows", "loop_optim", "train_stage"]


def loop_optim(section: BmStageSection, steps: int, steps_per_epoch: int) -> OptimSection:
    """The loop's :class:`~medadapt.training.config.OptimSection` for ``section``: fractional ``epochs``
    become ``max_steps = ceil(epochs * steps_per_epoch)`` (as transformers' trainer counts them), and
    ``warmup_steps`` the warm-up ratio of exactly that many of the stage's ``steps``."""
    epochs = math.ceil(section.epochs)
    max_steps = section.max_steps
    if epochs != section.epochs:
        fraction = max(1, math.ceil(section.epochs * steps_per_epoch))
        max_steps = min(max_steps, fraction) if max_steps else fraction
    base = OptimSection(epochs=epochs, max_steps=max_steps, batch_size=section.batch_size,
                        gradient_accumulation_steps=section.gradient_accumulation_steps, lr=section.lr,
                        weight_decay=section.weight_decay, warmup_ratio=0.0, scheduler=section.scheduler,
                        max_grad_norm=section.max_grad_norm)
    if section.warmup_steps is None:
        return base.model_copy(update={"warmup_ratio": section.warmup_ratio})
    total = min(steps, max_steps) if max_steps else steps
    # the loop warms up over int(ratio * total) steps: the half step keeps float rounding off the count
    return base.model_copy(update={"warmup_ratio": (section.warmup_steps + 0.5) / max(1, total)})


def _columns(table) -> list[str]:
    names = list(table.keys()) if isinstance(table, Mapping) else list(table.column_names)
    if "anchor" not in names or "positive" not in names:
        raise ConfigError(f"BMRetriever training data needs 'anchor' and 'positive' columns, got {names}")
    return ["anchor", "positive", *sorted(n for n in names if n.startswith("negative"))]


def _prompts(prompts: Mapping[str, Any], name: str | None, columns: list[str]) -> tuple[str, str]:
    """``(anchor prompt, positive / negative prompt)`` of one data set from sentence-transformers' ``prompts``
    form (``{column: prompt}`` or ``{dataset: {column: prompt}}``)."""
    own = prompts.get(name) if name is not None else None
    table = own if isinstance(own, Mapping) else {k: v for k, v in prompts.items() if isinstance(v, str)}
    passage = table.get("positive", "")
    for column in columns[2:]:
        if table.get(column, table.get("negative", passage)) != passage:
            raise ConfigError(f"data set {name!r}: the negatives' prompt must be the positives' ({passage!r})")
    return table.get("anchor", ""), passage


def contrastive_stage(model: nn.Module, data, prompts: Mapping[str, Any], section: BmStageSection, *,
                      seed: int, name: str = "stage") -> Stage:
    """The :class:`~medadapt.training.loop.Stage` of one BMRetriever stage: ``model``'s parameters that
    require gradients (the LoRA matrices when an adapter is attached) trained on ``data`` (a table with
    ``anchor`` / ``positive`` (/ ``negative...``) columns, a ``datasets.Dataset`` or a dict of lists; or a dict
    of such tables by data set name) with ``prompts`` (``{column: prompt}`` or ``{dataset: {column:
    prompt}}``)."""
    named = isinstance(data, Mapping) and not any(isinstance(v, list) for v in data.values())
    names = list(data) if named else [None]
    tables = list(data.values()) if named else [data]
    columns = [_columns(t) for t in tables]
    rows = TextRows(tables, columns)
    if len(rows) == 0:
        raise ConfigError(f"BMRetriever {name}: no training rows")
    table_prompts = [_prompts(prompts or {}, n, c) for n, c in zip(names, columns)]
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ConfigError(f"BMRetriever {name}: no trainable parameters")
    keys = [rows.keys(t) for t in range(len(tables))] if section.no_duplicates else None
    batches = DatasetBatches(rows.sizes, section.effective_batch_size, seed, keys=keys)
    step = TextPairStep(model, rows, InfoNCELoss(section.temperature, similarity="dot"),
                        prompts=lambda i: table_prompts[rows.part(i)])
    per_epoch = len(batches(0))
    steps = sum(len(batches(e)) for e in range(math.ceil(section.epochs)))
    return Stage(name, len(rows), step, params, loop_optim(section, steps, per_epoch), batches=batches)


def train_stage(model: nn.Module, data, prompts: Mapping[str, Any], section: BmStageSection, *, seed: int = 42,
                name: str = "stage", **train_kwargs: Any) -> LoopResult:
    """Train ``model`` in place through :func:`contrastive_stage` on the one loop
    (:func:`medadapt.training.loop.train`; ``train_kwargs``: accelerator, checkpoint, fingerprint, progress)."""
    return train(model, [contrastive_stage(model, data, prompts, section, seed=seed, name=name)], seed=seed,
                 **train_kwargs)


def logged_rows(rows: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """The loss rows as a stage summary logs them: one per ``every`` steps (the last window may be shorter),
    ``{"step", "loss" (mean over the window), "lr" (the window's last)}``."""
    out = []
    for lo in range(0, len(rows), every):
        window = rows[lo: lo + every]
        out.append({"step": int(window[-1]["step"]), "loss": sum(float(r["loss"]) for r in window) / len(window),
                    "lr": float(window[-1]["lr"])})
    return out
