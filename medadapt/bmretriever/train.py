"""BMRetriever's two stages as :class:`~medadapt.training.loop.Stage`\\ s of the one loop, and the recipe's
``train``.

Both stages minimise dot-product InfoNCE at temperature ``τ`` (paper: 1), stage I over in-batch negatives
(eq. 2), stage II over in-batch + hard negatives (eq. 3), with GradCache accumulation and one data set per
batch (:class:`~medadapt.training.steps.DatasetBatches`). Each stage trains a fresh seeded LoRA adapter,
merged afterwards, with checkpoints in ``<output>.checkpoints/stage1`` / ``stage2`` claimed by the
fingerprint of what decides their weights; a finished stage I is saved to ``stage1-model`` and reused.
See docs/bmretriever.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medadapt.bmretriever.finetune_data import stage2_datasets
from medadapt.bmretriever.model import build_retriever
from medadapt.bmretriever.pretrain_data import stage1_dataset
from medadapt.bmretriever.sections import BmRetrieverRecipe, BmStageSection, Stage2Section
from medadapt.checksums import ChecksumError, verify_sums, write_sums
from medadapt.data import load_beir
from medadapt.errors import ConfigError, warn
from medadapt.io import atomic_write_text
from medadapt.losses.infonce import InfoNCELoss
from medadapt.models import load
from medadapt.recipes.run import RunContext, fingerprint, replace_folder
from medadapt.training.checkpoint import CheckpointCorruptError, all_checkpoints, load_checkpoint
from medadapt.training.config import OptimSection
from medadapt.training.loop import LoopResult, Stage
from medadapt.training.loop import train as train_loop
from medadapt.training.lora import attach_lora, enable_gradient_checkpointing, merge_lora
from medadapt.training.steps import DatasetBatches, TextPairStep, TextRows

__all__ = ["contrastive_stage", "frozen_base", "logged_rows", "loop_optim", "stage1", "stage2", "train",
           "train_stage"]


def loop_optim(section: BmStageSection, steps: int, steps_per_epoch: int) -> OptimSection:
    """The loop's optimiser section for ``section``: fractional ``epochs`` become ``max_steps = ceil(epochs *
    steps_per_epoch)`` (as transformers' trainer counts them), ``warmup_steps`` a ratio of the ``steps``."""
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
    """``(anchor prompt, passage prompt)`` of one data set, from ``{column: prompt}`` or ``{dataset: {...}}``."""
    own = prompts.get(name) if name is not None else None
    table = own if isinstance(own, Mapping) else {k: v for k, v in prompts.items() if isinstance(v, str)}
    passage = table.get("positive", "")
    for column in columns[2:]:
        if table.get(column, table.get("negative", passage)) != passage:
            raise ConfigError(f"data set {name!r}: the negatives' prompt must be the positives' ({passage!r})")
    return table.get("anchor", ""), passage


def contrastive_stage(model: nn.Module, data, prompts: Mapping[str, Any], section: BmStageSection, *,
                      seed: int, name: str = "stage") -> Stage:
    """One BMRetriever stage: ``model``'s trainable parameters on ``data`` (a table with ``anchor`` /
    ``positive`` (/ ``negative...``) columns, a ``Dataset`` or a dict of lists, or a dict of tables by data
    set name) with ``prompts`` (``{column: prompt}`` or ``{dataset: {column: prompt}}``)."""
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
    """Train ``model`` in place on :func:`contrastive_stage` (``train_kwargs`` go to the one loop)."""
    return train_loop(model, [contrastive_stage(model, data, prompts, section, seed=seed, name=name)],
                      seed=seed, **train_kwargs)


def logged_rows(rows: list[dict[str, Any]], every: int) -> list[dict[str, Any]]:
    """The loss rows of a stage summary: ``{"step", "loss" (window mean), "lr"}`` per ``every`` steps."""
    out = []
    for lo in range(0, len(rows), every):
        window = rows[lo: lo + every]
        out.append({"step": int(window[-1]["step"]), "loss": sum(float(r["loss"]) for r in window) / len(window),
                    "lr": float(window[-1]["lr"])})
    return out


def _build(recipe: BmRetrieverRecipe, device: str | None):
    m = recipe.model
    return build_retriever(m.name, m.kind, max_seq_length=m.max_seq_length, padding_side=m.padding_side,
                           torch_dtype=m.torch_dtype, normalize=m.normalize, device=device)


def frozen_base(recipe: BmRetrieverRecipe, ctx: RunContext):
    """The untrained encoder :func:`train` starts from, with the inference prompts (``eval.baseline``)."""
    model = _build(recipe, ctx.device)
    model.prompts = {"query": recipe.eval_query_prompt(), "document": recipe.instructions.passage}
    return model


def _claim(folder: Path, identity: str, ctx: RunContext) -> None:
    """Refuse to resume ``folder`` when it holds the checkpoints of another run; record ``identity``."""
    mark = folder / "fingerprint.txt"
    unmarked = not mark.is_file() and folder.is_dir() and any(folder.glob("step-*"))  # nobody's run
    if unmarked or (mark.is_file() and mark.read_text().strip() != identity):
        raise ConfigError(f"{folder} holds checkpoints of another run (recipe, data or base model differ); "
                          "train into a new output folder, or pass --overwrite to start this one afresh")
    if ctx.is_main and not mark.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(mark, identity)
    ctx.accelerator.wait_for_everyone()


def _stage(recipe: BmRetrieverRecipe, ctx: RunContext, model, index: int, section: BmStageSection, data,
           prompts, identity: str) -> Stage:
    """Claim the stage's checkpoint folder, attach its fresh LoRA adapter (seeded), return its Stage."""
    name, m = f"stage{index + 1}", recipe.model
    _claim(ctx.checkpoint_dir / name, identity, ctx)
    lora = m.lora if section.lora else None
    if lora is not None:
        with torch.random.fork_rng(devices=[]):  # the adapter's initial weights depend on the seed only
            torch.manual_seed(recipe.training.seed * 1_000_003 + index)
            attach_lora(model, lora, gradient_checkpointing=m.gradient_checkpointing)
    elif m.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    stage = contrastive_stage(model, data, prompts, section, seed=recipe.training.seed, name=name)
    how = f"LoRA r={lora.r}" if lora is not None else "full fine-tuning"
    ctx.log(f"{name}: {stage.n_items} rows, global batch {section.effective_batch_size}, {how}, "
            f"tau={section.temperature}")
    return stage


def stage1_identity(recipe: BmRetrieverRecipe) -> str:
    """Fingerprint of what decides the stage I weights: the recipe with stage II off."""
    only_stage1 = recipe.model_copy(update={"stage2": Stage2Section(enabled=False)})
    only_stage1._source = recipe._source
    return fingerprint(only_stage1)


def stage1(recipe: BmRetrieverRecipe, ctx: RunContext, model) -> Stage:
    """Stage I (§3.2): title -> text / cropped pairs, in-batch negatives."""
    with ctx.accelerator.main_process_first():
        data = stage1_dataset(recipe)
    ins = recipe.instructions
    return _stage(recipe, ctx, model, 0, recipe.stage1, data, {"anchor": ins.pretrain_query, "positive": ins.passage},
                  stage1_identity(recipe))


def _share_mining_encode(recipe: BmRetrieverRecipe, ctx: RunContext):
    """Under several processes with mining: the base retriever, after every process encoded its share of
    each mined corpus into the cache (the main process then mines from it); ``None`` otherwise."""
    s2 = recipe.stage2
    beir_tasks = [t for t in s2.tasks if t.kind == "beir"]
    if ctx.accelerator.num_processes <= 1 or not s2.hard_negatives or not beir_tasks:
        return None
    base = load(s2.base_retriever, device=ctx.device)
    for path in dict.fromkeys(str(recipe.resolve(t.path or recipe.data.path)) for t in beir_tasks):
        ctx.share_encoding(base, load_beir(path, splits=[]).doc_texts(),
                           batch_size=recipe.training.encode_batch_size)
    return base


def stage2(recipe: BmRetrieverRecipe, ctx: RunContext, model) -> Stage:
    """Stage II (§3.3): per task (query, positive, hard negative) rows and the synthetic data sets, whose
    generated / kept counts go to ``train_log.json`` under ``synthetic``."""
    t0 = time.perf_counter()
    base = _share_mining_encode(recipe, ctx)
    synthetic: dict[str, Any] = {}
    with ctx.accelerator.main_process_first():  # the main process fills the embedding cache, the others read it
        data, prompts = stage2_datasets(recipe, cache=ctx.cache, device=ctx.device,
                                        show_progress=ctx.show_progress and ctx.is_main, log=ctx.log, base=base,
                                        report=synthetic)
    if synthetic:
        ctx.result.details["synthetic"] = synthetic
    ctx.result.encode_seconds += time.perf_counter() - t0
    return _stage(recipe, ctx, model, 1, recipe.stage2, data, prompts, ctx.fingerprint)


def _intact(folder: Path) -> bool:
    """``folder`` holds a finished stage I model whose ``SHA256SUMS`` match (a damaged one: warned)."""
    if not (folder / "modules.json").is_file():
        return False
    try:
        verify_sums(folder, complete=True)
    except ChecksumError as exc:
        warn(f"stage I model: {exc}; finishing stage I from its checkpoints again")
        return False
    return True


def _finished_rows(folder: Path) -> list[dict[str, Any]]:
    """The loss rows of a finished stage, from its newest intact checkpoint (none when there is none)."""
    for path in all_checkpoints(folder):
        try:
            return list(load_checkpoint(path)[2]["loss_history"])
        except CheckpointCorruptError:
            continue
    return []


def train(recipe: BmRetrieverRecipe, ctx: RunContext):
    """Train stage I and stage II; returns the model with its ``query`` / ``document`` prompts. Per-stage
    summaries go to ``ctx.result.details["stages"]``."""
    summaries: dict[str, Any] = ctx.result.details.setdefault("stages", {})
    model = _build(recipe, ctx.device)

    def run(stage: Stage, identity: str) -> None:
        res = ctx.train(model, [stage], name=stage.name, fingerprint=identity)
        merge_lora(model)
        hist = logged_rows(res.loss_history, recipe.training.logging_steps or max(1, min(50, res.steps // 20)))
        summaries[stage.name] = {"rows": stage.n_items, "steps": res.steps, "seconds": round(res.seconds, 2),
                                 "first_loss": hist[0]["loss"] if hist else None,
                                 "last_loss": hist[-1]["loss"] if hist else None, "loss_history": hist}

    stage1_model = ctx.checkpoint_dir / "stage1-model"
    if recipe.stage1.enabled and _intact(stage1_model):
        _claim(ctx.checkpoint_dir / "stage1", stage1_identity(recipe), ctx)
        ctx.log(f"stage I: finished earlier, loading {stage1_model}")
        model = load(str(stage1_model), device=ctx.device)  # trusts only sentence_transformers / medadapt
        summaries["stage1"] = {"resumed": True}
        ctx.result.loss_history += _finished_rows(ctx.checkpoint_dir / "stage1")
    elif recipe.stage1.enabled:
        run(stage1(recipe, ctx, model), stage1_identity(recipe))
        if ctx.is_main:
            with replace_folder(stage1_model) as tmp:
                model.save(str(tmp))
                write_sums(tmp)  # a rerun reuses it only when every file is intact
        ctx.accelerator.wait_for_everyone()
    if recipe.stage2.enabled:
        run(stage2(recipe, ctx, model), ctx.fingerprint)
    model.prompts = {"query": recipe.eval_query_prompt(), "document": recipe.instructions.passage}
    return model
