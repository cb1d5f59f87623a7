"""One BMRetriever training stage on sentence-transformers' ``SentenceTransformerTrainer`` (Accelerate).

Both stages minimise InfoNCE with dot-product similarity and temperature ``τ`` (paper: 1),
``MultipleNegativesRankingLoss(scale=1/τ, similarity_fct=dot_score)``, over in-batch negatives (stage I,
eq. 2) or in-batch + hard negatives (stage II, eq. 3: a ``negative`` column); ``gather_across_devices``
makes the negatives those of the global batch. Batch sizes are **global**: ``split_batches=True`` gives
every process its ``1/N`` share of each batch, so ``N`` processes see the batches one process sees.
``gradient_accumulation_steps = k`` keeps the loop's meaning (one step = ``k * batch_size`` rows, in-batch
negatives over all of them) through ``CachedMultipleNegativesRankingLoss`` (GradCache), not through the
trainer's own accumulation, which would shrink the negatives to one chunk. Instructions are ST prompts per
data set and column; a ``DatasetDict`` trains one data set per batch (``proportional`` sampling).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from medadapt.bmretriever.schema import BmStageSection
    from medadapt.recipes.base import RunSection

__all__ = ["StageResult", "train_stage"]


@dataclass
class StageResult:
    """What :func:`train_stage` did: optimiser steps, wall-clock seconds, logged rows (``step``, ``loss``,
    ``lr``)."""

    steps: int = 0
    seconds: float = 0.0
    loss_history: list[dict[str, float]] = field(default_factory=list)


def train_stage(model, train_data, prompts: dict[str, Any], stage: BmStageSection, run: RunSection,
                checkpoint_dir: str | Path, *, show_progress: bool = True) -> StageResult:
    """Train ``model`` (whatever requires gradients, e.g. LoRA matrices) in place on ``train_data``
    (``anchor`` / ``positive`` (/ ``negative``) rows, a ``Dataset`` or ``DatasetDict``) and return the losses.

    Args:
        prompts: ST's ``prompts`` argument (``{column: prompt}`` or ``{dataset: {column: prompt}}``).
        stage: the stage's :class:`~medadapt.bmretriever.schema.BmStageSection` (optimisation, τ,
            duplicates).
        run: the recipe's ``training`` section (seed, precision, device, checkpoints, ``logging_steps``).
        checkpoint_dir: the trainer's checkpoints; resumes from the newest one there that reads back intact
            (:func:`medadapt.training.guards.train_guarded`: a non-finite loss or parameters stop the stage).
    """
    import torch
    from accelerate import PartialState
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.training_args import BatchSamplers, MultiDatasetBatchSamplers
    from sentence_transformers.sentence_transformer.losses import (CachedMultipleNegativesRankingLoss,
                                                                   MultipleNegativesRankingLoss)
    from sentence_transformers.util import dot_score

    from medadapt.training.distributed import use_fsdp_wrap_policy
    from medadapt.training.guards import train_guarded

    ckpt = Path(checkpoint_dir)
    use_cpu = run.device == "cpu" or not torch.cuda.is_available()
    k = stage.gradient_accumulation_steps
    global_batch = stage.batch_size * k  # one optimiser step; GradCache keeps its in-batch negatives exact
    n_rows = sum(len(d) for d in train_data.values()) if hasattr(train_data, "values") else len(train_data)
    total = stage.max_steps or max(1, int(max(1, n_rows // global_batch) * stage.epochs))
    every = run.checkpoint_every_steps
    logging_steps = getattr(run, "logging_steps", None) or max(1, min(50, total // 20))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(ckpt), num_train_epochs=stage.epochs, max_steps=stage.max_steps or -1,
        per_device_train_batch_size=global_batch,  # the global batch: split_batches shares it out
        accelerator_config={"split_batches": True}, learning_rate=stage.lr, weight_decay=stage.weight_decay,
        warmup_steps=stage.warmup, max_grad_norm=stage.max_grad_norm or 0.0,
        lr_scheduler_type="constant_with_warmup" if stage.scheduler == "constant" else stage.scheduler,
        seed=run.seed, data_seed=run.seed, bf16=run.mixed_precision == "bf16",
        fp16=run.mixed_precision == "fp16", use_cpu=use_cpu, prompts=prompts or None,
        batch_sampler=BatchSamplers.NO_DUPLICATES if stage.no_duplicates else BatchSamplers.BATCH_SAMPLER,
        multi_dataset_batch_sampler=MultiDatasetBatchSamplers.PROPORTIONAL,
        save_strategy="steps" if every else "no", save_steps=every or 500, save_total_limit=2,
        logging_steps=logging_steps, report_to="none", disable_tqdm=not show_progress,
        dataloader_drop_last=True, ddp_find_unused_parameters=False,
    )
    scale = 1.0 / stage.temperature
    if k > 1:
        world = PartialState().num_processes
        loss = CachedMultipleNegativesRankingLoss(model, scale=scale, similarity_fct=dot_score,
                                                  mini_batch_size=max(1, stage.batch_size // world),
                                                  gather_across_devices=True)
    else:
        loss = MultipleNegativesRankingLoss(model, scale=scale, similarity_fct=dot_score,
                                            gather_across_devices=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_data, loss=loss)
    # Under FSDP the trainer wraps a SentenceTransformer, not a PeftModel: its own LoRA wrap policy does not apply
    use_fsdp_wrap_policy(trainer.accelerator, model)
    t0 = time.perf_counter()
    train_guarded(trainer, ckpt)  # non-finite stops; checkpoints with sums; resumes the newest intact one
    return StageResult(
        steps=int(trainer.state.global_step),
        seconds=time.perf_counter() - t0,
        loss_history=[{"step": int(r["step"]), "loss": float(r["loss"]),
                       **({"lr": float(r["learning_rate"])} if "learning_rate" in r else {})}
                      for r in trainer.state.log_history if "loss" in r],
    )
