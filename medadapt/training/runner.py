"""Run a recipe end to end: data -> backbone (+ head) -> training on Accelerate -> save -> evaluate.

Two paths, chosen by the recipe:

* **Fast path** (``model.freeze_backbone: true``, no ``peft``, a ``head``): the backbone's embeddings of the
  training queries and of the corpus come from the :class:`~medadapt.cache.EmbeddingCache` (encoded once,
  ever), hard negatives are mined on them, and only the head trains
  (:func:`~medadapt.training.head_trainer.train_head`, Med-MoE-Embed's two-step schedule). Minutes on a CPU.
* **Slow path** (backbone unfrozen, or a PEFT LoRA adapter): sentence-transformers'
  ``SentenceTransformerTrainer`` (itself on Accelerate) with ``MultipleNegativesRankingLoss`` at
  ``scale = 1 / temperature`` and the mined hard negatives as extra columns; a head, if any, trains jointly.

Both run unchanged on CPU, one GPU, or many under ``accelerate launch`` (``training.batch_size`` is the
global batch; the fast path gathers embeddings across processes so the loss equals the one-process loss,
see :mod:`medadapt.training.distributed`); both checkpoint into ``OUTPUT/checkpoints`` and resume from there
after a kill. Under several processes only the main process logs, shows progress bars, saves and
evaluates; it also fills the embedding cache first, the other processes then read it.

Output folder (loadable by :func:`medadapt.load` and ``medadapt eval --model OUTPUT``): the saved
SentenceTransformer, plus ``recipe.yaml`` (the resolved recipe), ``train_log.json`` and ``metrics.json``.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medadapt.errors import ConfigError
from medadapt.io import atomic_write_json, atomic_write_text
from medadapt.recipes.loader import resolve_path
from medadapt.recipes.schema import Recipe


@dataclass
class RunResult:
    """What :func:`run_recipe` did.

    Attributes:
        output_dir: the saved model folder.
        metrics: evaluation results on ``eval.split`` (empty if evaluation was skipped).
        expected: metric -> (target, met) for the recipe's ``eval.expected`` scores.
        encode_seconds / train_seconds: wall time spent encoding into the cache / training.
        loss_history: per-step loss parts.
    """

    output_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    expected: dict[str, tuple[float, bool]] = field(default_factory=dict)
    encode_seconds: float = 0.0
    train_seconds: float = 0.0
    loss_history: list[dict[str, float]] = field(default_factory=list)
    routing_stats: dict[str, Any] = field(default_factory=dict)

    def write_run_files(self, output_dir: Path, recipe, **log: Any) -> None:
        """Write ``recipe.yaml`` (the validated recipe) and ``train_log.json`` (encode / train seconds,
        ``log``'s extra entries, loss history) into ``output_dir`` atomically."""
        import yaml

        atomic_write_text(Path(output_dir) / "recipe.yaml",
                          yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
        atomic_write_json(Path(output_dir) / "train_log.json", {
            "encode_seconds": round(self.encode_seconds, 2), "train_seconds": round(self.train_seconds, 2),
            **log, "loss_history": self.loss_history})

    def record_metrics(self, metrics: dict[str, float], ev, output_dir: Path | None = None) -> None:
        """Keep ``metrics``, check them against ``ev.expected`` (within ``ev.tolerance``) and, with
        ``output_dir``, write ``metrics.json`` there atomically."""
        self.metrics = dict(metrics)
        for metric, target in ev.expected.items():
            value = self.metrics.get(metric)
            self.expected[metric] = (target, value is not None and value >= target - ev.tolerance)
        if output_dir is not None:
            from medadapt.io import atomic_write_json

            atomic_write_json(Path(output_dir) / "metrics.json", {k: round(v, 6) for k, v in self.metrics.items()})


def _accelerator(recipe: Recipe):
    import torch
    from accelerate import Accelerator

    want_cpu = recipe.model.device == "cpu" or not torch.cuda.is_available()
    return Accelerator(cpu=want_cpu, mixed_precision=recipe.training.mixed_precision)


def _save_model_atomically(model, output_dir: Path) -> None:
    """Save into a temporary sibling folder, then move the files in, ``modules.json`` last (a folder without
    ``modules.json`` is not loadable, so readers never see a half-written model)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    tmp = output_dir / f".tmp-model-{uuid.uuid4().hex}"
    try:
        model.save(str(tmp))
        (output_dir / "modules.json").unlink(missing_ok=True)
        entries = sorted(tmp.iterdir(), key=lambda p: p.name == "modules.json")
        for entry in entries:
            target = output_dir / entry.name
            if target.is_dir() and entry.is_dir():
                shutil.rmtree(target)
            os.replace(entry, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run_recipe(
    recipe: Recipe,
    output_dir: str | Path,
    *,
    recipe_path: str | Path | None = None,
    cache=None,
    show_progress: bool = True,
    evaluate: bool = True,
    log: Callable[[str], None] = print,
) -> RunResult:
    """Train what ``recipe`` describes into ``output_dir``, then evaluate it (see module docstring)."""
    import torch

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.models import load

    output_dir = Path(output_dir)
    cache = cache if cache is not None else EmbeddingCache()
    data_path = resolve_path(recipe.data.path, recipe_path)
    data = load_beir(data_path, [recipe.data.train_split])
    accelerator = _accelerator(recipe)
    if not accelerator.is_main_process:
        log, show_progress = (lambda message: None), False
    model = load(recipe.model.backbone, device=str(accelerator.device))
    if recipe.model.max_seq_length:
        model.max_seq_length = recipe.model.max_seq_length
    fast = recipe.model.freeze_backbone and recipe.model.peft is None
    if fast and recipe.head.kind == "none":
        raise ConfigError("nothing to train: the backbone is frozen, there is no peft adapter and head.kind is none")
    torch.manual_seed(recipe.training.seed)
    result = RunResult(output_dir=output_dir)
    if fast:
        _train_head_fast(recipe, model, data, cache, accelerator, output_dir, result, show_progress, log)
    else:
        _train_slow(recipe, model, data, cache, output_dir, result, show_progress, log)

    if accelerator.is_main_process:
        _save_model_atomically(model, output_dir)
        result.write_run_files(output_dir, recipe, routing_stats=_jsonable(result.routing_stats))
    accelerator.wait_for_everyone()
    if evaluate and accelerator.is_main_process:
        _evaluate(recipe, model, data_path, recipe_path, cache, result, show_progress, log)
        atomic_write_json(output_dir / "metrics.json", {k: round(v, 6) for k, v in result.metrics.items()})
    return result


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def _prepare(recipe, model, data, cache, show_progress, log):
    from medadapt.training.pairs import prepare_head_training

    return prepare_head_training(model, data, recipe.data.train_split, cache, mining=recipe.data.hard_negatives,
                                 max_queries=recipe.data.max_train_queries,
                                 batch_size=recipe.model.encode_batch_size, show_progress=show_progress, log=log)


def _train_head_fast(recipe, model, data, cache, accelerator, output_dir, result, show_progress, log):
    from medadapt.heads import MoEHead, attach
    from medadapt.training.checkpoint import CheckpointConfig
    from medadapt.training.head_trainer import HeadTrainConfig, train_head

    t0 = time.perf_counter()
    with accelerator.main_process_first():  # main encodes into the cache, the others read it
        prepared = _prepare(recipe, model, data, cache, show_progress, log)
    result.encode_seconds = time.perf_counter() - t0
    head = MoEHead(recipe.head.to_config(prepared.query_raw.shape[1]))
    t = recipe.training
    config = HeadTrainConfig(
        epochs=t.epochs, shared_epochs=t.shared_epochs, random_routing_epochs=t.random_routing_epochs,
        batch_size=t.batch_size, lr=t.lr, weight_decay=t.weight_decay, temperature=recipe.loss.temperature,
        load_balance_weight=recipe.loss.load_balance_weight, scheduler=t.scheduler, warmup_ratio=t.warmup_ratio,
        max_grad_norm=t.max_grad_norm, seed=t.seed, device=str(accelerator.device),
    )
    q, p, n = prepared.tensors()
    checkpoint = CheckpointConfig(output_dir / "checkpoints", every_steps=t.checkpoint_every_steps)
    log(f"training {sum(x.numel() for x in head.parameters()):,}-parameter head on {len(prepared.pairs):,} pairs "
        f"({'with' if n is not None else 'without'} hard negatives) on {accelerator.device}")
    with _progress(show_progress and accelerator.is_main_process) as update:
        train = train_head(head, q, p, n, config, progress=update, checkpoint=checkpoint, accelerator=accelerator)
    result.train_seconds = train.seconds
    result.loss_history = train.loss_history
    result.routing_stats = train.routing_stats
    attach(model, head)


class _progress:
    """A rich progress bar fed by :class:`~medadapt.training.head_trainer.TrainProgress` callbacks."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
        self.bar.start()
        self.task = None
        return self.update

    def update(self, p) -> None:
        if self.task is None:
            self.task = self.bar.add_task("training", total=p.total_steps, info="")
        self.bar.update(self.task, completed=p.step, description=f"training ({p.stage})",
                        info=f"loss {p.losses['loss']:.4f}")

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


def _train_slow(recipe, model, data, cache, output_dir, result, show_progress, log):
    """Backbone (or LoRA) training through sentence-transformers' trainer (Accelerate underneath)."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.base.training_args import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    if recipe.model.peft is not None:
        from peft import LoraConfig

        lora = recipe.model.peft
        model.add_adapter(LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                                     target_modules=lora.target_modules))
    if recipe.head.kind == "moe":
        from medadapt.heads import MoEHead, attach

        attach(model, MoEHead(recipe.head.to_config(model.get_sentence_embedding_dimension())))
    t0 = time.perf_counter()
    from accelerate import PartialState

    with PartialState().main_process_first():  # main encodes into the cache, the others read it
        prepared = _prepare(recipe, model, data, cache, show_progress, log)
    result.encode_seconds = time.perf_counter() - t0
    pairs, negatives = prepared.pairs, prepared.negatives
    texts = data.doc_texts()
    columns: dict[str, list[str]] = {
        "anchor": [data.queries[pairs.query_ids[i]] for i in pairs.pair_query],
        "positive": [texts[j] for j in pairs.pair_doc],
    }
    if negatives is not None:
        for k in range(negatives.shape[1]):
            columns[f"negative_{k + 1}"] = [texts[negatives[i, k]] for i in pairs.pair_query]
    dataset = Dataset.from_dict(columns)
    t = recipe.training
    ckpt_dir = output_dir / "checkpoints"
    total_steps = max(1, len(dataset) // (t.batch_size * t.gradient_accumulation_steps)) * max(1, t.epochs)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(ckpt_dir), num_train_epochs=t.epochs, per_device_train_batch_size=t.batch_size,
        learning_rate=t.lr, weight_decay=t.weight_decay, warmup_ratio=t.warmup_ratio, seed=t.seed,
        lr_scheduler_type=t.scheduler if t.scheduler != "constant" else "constant_with_warmup",
        max_grad_norm=t.max_grad_norm or 0.0, bf16=t.mixed_precision == "bf16", fp16=t.mixed_precision == "fp16",
        gradient_accumulation_steps=t.gradient_accumulation_steps, batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="steps" if t.checkpoint_every_steps else "epoch", save_steps=t.checkpoint_every_steps or 500,
        save_total_limit=2, logging_steps=max(1, min(50, total_steps // 20)), report_to="none",
        disable_tqdm=not show_progress,
    )
    loss = MultipleNegativesRankingLoss(model, scale=1.0 / recipe.loss.temperature)
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=dataset, loss=loss)
    resume = ckpt_dir.is_dir() and any(ckpt_dir.glob("checkpoint-*"))
    t1 = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if resume else None)
    result.train_seconds = time.perf_counter() - t1
    result.loss_history = [{"step": float(r["step"]), "loss": float(r["loss"])}
                           for r in trainer.state.log_history if "loss" in r]


def _evaluate(recipe, model, data_path, recipe_path, cache, result, show_progress, log):
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval

    ev = recipe.eval
    path = data_path if ev.data is None else resolve_path(ev.data, recipe_path)
    data = load_beir(path, [ev.split])
    result.record_metrics(evaluate_retrieval(model, data, ev.split, ev.metrics, cache=cache,
                                             show_progress=show_progress), ev)


__all__ = ["RunResult", "run_recipe"]
