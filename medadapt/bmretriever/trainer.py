"""One BMRetriever training stage on sentence-transformers' ``SentenceTransformerTrainer`` (Accelerate).

Both stages minimise InfoNCE with dot-product similarity and temperature ``τ`` (paper: 1):
``MultipleNegativesRankingLoss(scale=1/τ, similarity_fct=dot_score)`` over in-batch negatives (stage I,
eq. 2) or in-batch + hard negatives (stage II, eq. 3: a ``negative`` column). With
``gather_across_devices=True`` every process scores its queries against the passages of *all* processes,
so the negatives are those of the global batch, as on one device.

Batch sizes are **global**: Accelerate's ``split_batches=True`` makes every process take its
``1/N`` share of each global batch, so ``N`` processes see exactly the batches one process sees (same
seed, same order). The logged loss is the mean over processes (= the global-batch loss).

Instructions are sentence-transformers prompts (training argument ``prompts``): per data set and column
(``anchor`` -> query prompt, ``positive`` / ``negative`` -> passage prompt). Several data sets train as a
``DatasetDict``; every batch comes from one data set (``proportional`` sampling), i.e. one task per batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["StageConfig", "StageResult", "train_stage"]


@dataclass
class StageConfig:
    """Optimisation of one stage (Appendix D: AdamW, linear warm-up over the first 100 steps).

    Attributes:
        batch_size: global batch size (split over processes).
        warmup_steps: linear warm-up steps, then ``scheduler`` decay.
        max_steps: stop after this many optimiser steps (overrides ``epochs``).
    """

    epochs: float = 1.0
    batch_size: int = 256
    lr: float = 5e-5
    weight_decay: float = 0.0
    warmup_steps: int = 100
    scheduler: Literal["linear", "cosine", "constant"] = "linear"
    max_grad_norm: float | None = 1.0
    max_steps: int | None = None
    temperature: float = 1.0
    seed: int = 42
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    checkpoint_every_steps: int | None = None
    logging_steps: int | None = None
    no_duplicates: bool = True
    use_cpu: bool = False


@dataclass
class StageResult:
    steps: int = 0
    seconds: float = 0.0
    loss_history: list[dict[str, float]] = field(default_factory=list)


def train_stage(model, train_data, prompts: dict[str, Any], config: StageConfig, checkpoint_dir: str | Path, *,
                show_progress: bool = True) -> StageResult:
    """Train ``model`` in place on ``train_data`` (a ``Dataset`` or ``DatasetDict``) and return the losses.

    ``prompts`` is ST's ``prompts`` training argument (``{column: prompt}`` or ``{dataset: {column:
    prompt}}``). Resumes from the newest checkpoint in ``checkpoint_dir`` when there is one."""
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.training_args import BatchSamplers, MultiDatasetBatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import dot_score

    ckpt = Path(checkpoint_dir)
    n_rows = sum(len(d) for d in train_data.values()) if hasattr(train_data, "values") else len(train_data)
    steps_per_epoch = max(1, n_rows // config.batch_size)
    total = config.max_steps or max(1, int(steps_per_epoch * config.epochs))
    args = SentenceTransformerTrainingArguments(
        output_dir=str(ckpt),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps or -1,
        per_device_train_batch_size=config.batch_size,  # the global batch: split_batches shares it out
        accelerator_config={"split_batches": True},
        learning_rate=config.lr,
        weight_decay=config.weight_decay,
        warmup_steps=config.warmup_steps,
        lr_scheduler_type="constant_with_warmup" if config.scheduler == "constant" else config.scheduler,
        max_grad_norm=config.max_grad_norm or 0.0,
        seed=config.seed,
        data_seed=config.seed,
        bf16=config.mixed_precision == "bf16",
        fp16=config.mixed_precision == "fp16",
        use_cpu=config.use_cpu,
        prompts=prompts or None,
        batch_sampler=BatchSamplers.NO_DUPLICATES if config.no_duplicates else BatchSamplers.BATCH_SAMPLER,
        multi_dataset_batch_sampler=MultiDatasetBatchSamplers.PROPORTIONAL,
        save_strategy="steps" if config.checkpoint_every_steps else "no",
        save_steps=config.checkpoint_every_steps or 500,
        save_total_limit=2,
        logging_steps=config.logging_steps or max(1, min(50, total // 20)),
        report_to="none",
        disable_tqdm=not show_progress,
        dataloader_drop_last=True,
        ddp_find_unused_parameters=False,
    )
    loss = MultipleNegativesRankingLoss(model, scale=1.0 / config.temperature, similarity_fct=dot_score,
                                        gather_across_devices=True)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train_data, loss=loss)
    resume = ckpt.is_dir() and any(ckpt.glob("checkpoint-*"))
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if resume else None)
    return StageResult(
        steps=int(trainer.state.global_step),
        seconds=time.perf_counter() - t0,
        loss_history=[{"step": float(r["step"]), "loss": float(r["loss"])}
                      for r in trainer.state.log_history if "loss" in r],
    )
