"""The one recipe runner behind ``medadapt train`` (docs/architecture.md, "How a recipe runs").

:func:`run_recipe` builds the ``Accelerator``, seeds, checks the output folder, calls the system's ``train``
with a :class:`RunContext`, saves the model folder atomically with ``recipe.yaml`` and ``train_log.json``,
then evaluates (``metrics.json``, the frozen baseline, ``eval.also`` sets, peers) and writes the model card;
under ``accelerate launch`` only the main process logs, saves and evaluates. Checkpoints live beside the
folder (``<output>.checkpoints/``) with the run's fingerprint: another recipe's are refused unless ``overwrite``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medadapt.adapters.api import adapter_names
from medadapt.adapters.files import describe_heads, read_adapter_config, write_adapter
from medadapt.cache import EmbeddingCache
from medadapt.cards import write_card
from medadapt.encode import share_encoding
from medadapt.errors import ConfigError, ModelLoadError
from medadapt.eval.tasks import evaluate, task_kind
from medadapt.identity import run_fingerprint as fingerprint  # the run's identity (also bmretriever's)
from medadapt.io import (FolderKind, atomic_write_json, atomic_write_text, check_output, clean_leftovers,
                         replace_folder)
from medadapt.models import check_device, load
from medadapt.recipes import registry
from medadapt.recipes.also import (as_modes, check_also_sets, eval_set_name, evaluate_also_sets, peer_warning,
                                   peers_as_modes, regression_warning)
from medadapt.recipes.base import RecipeBase
from medadapt.recipes.loader import load_recipe
from medadapt.training.checkpoint import CheckpointConfig
from medadapt.training.loop import check_finite_parameters, train
from medadapt.training.progress import StepProgress

__all__ = ["RunContext", "RunResult", "checkpoint_dir_for", "evaluate_dense", "replace_folder", "run_recipe"]


@dataclass
class RunResult:
    """What a run did. ``adapter_base``: set by a system whose model is an unchanged base plus medadapt heads
    (the folder then holds the heads alone); ``also``: ``{set: {"base", "trained", "delta"}}`` of ``eval.also``;
    ``peers``: ``{label: {"metrics", "also", "train_seconds"}}`` of ``eval.peers`` (:mod:`medadapt.moe.peers`);
    ``warnings``: the lines logged when the trained model is below the base on an ``also`` set, or a peer."""

    output_dir: Path
    metrics: dict[str, float] = field(default_factory=dict)
    expected: dict[str, tuple[float, bool]] = field(default_factory=dict)  # metric -> (target, met)
    encode_seconds: float = 0.0
    train_seconds: float = 0.0
    loss_history: list[dict[str, Any]] = field(default_factory=list)  # stage, step, loss, loss parts, lr
    details: dict[str, Any] = field(default_factory=dict)  # the system's facts, for train_log.json
    model: Any = field(default=None, repr=False)
    adapter_base: str | None = None
    baseline: dict[str, float] = field(default_factory=dict)  # the frozen base model's metrics
    also: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    peers: dict[str, dict[str, Any]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def record_metrics(self, metrics: dict[str, float], ev, output_dir: Path | None = None) -> None:
        """Keep ``metrics``, check them against ``ev.expected`` (within ``ev.tolerance``) and, with
        ``output_dir``, write ``metrics.json`` there atomically."""
        self.metrics = dict(metrics)
        for metric, target in ev.expected.items():
            value = self.metrics.get(metric)
            self.expected[metric] = (target, value is not None and value >= target - ev.tolerance)
        if output_dir is not None:
            self.write_metrics(output_dir)

    def write_metrics(self, output_dir: Path) -> None:
        """``metrics.json`` (atomically): the metrics, flat, and ``"also"`` / ``"peers"`` when there are some."""
        out: dict[str, Any] = _rounded(self.metrics)
        if self.also:
            out["also"] = {name: {part: _rounded(values) for part, values in row.items()}
                           for name, row in self.also.items()}
        peers = {}
        for label, row in self.peers.items():
            peers[label] = {**_rounded(row["metrics"]), "train_seconds": round(row["train_seconds"], 2)}
            if row["also"]:
                peers[label]["also"] = {name: _rounded(values) for name, values in row["also"].items()}
        if peers:
            out["peers"] = peers
        atomic_write_json(Path(output_dir) / "metrics.json", out)


def _rounded(metrics: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 6) for k, v in metrics.items()}


@dataclass
class RunContext:
    """Everything a system's ``train`` / ``evaluate`` gets from the runner."""

    recipe: RecipeBase
    output_dir: Path
    checkpoint_dir: Path
    accelerator: Any
    cache: Any
    result: RunResult
    fingerprint: str
    show_progress: bool = True
    log: Callable[[str], None] = print
    evaluate: bool = True  #: the run evaluates after training (``medadapt train --no-eval``: false)

    @property
    def device(self) -> str:
        return str(self.accelerator.device)

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    def resolve(self, value: str) -> Path:
        return self.recipe.resolve(value)

    def checkpoint(self, name: str | None = None):
        """A :class:`~medadapt.training.checkpoint.CheckpointConfig` in the run's checkpoint folder."""
        folder = self.checkpoint_dir if name is None else self.checkpoint_dir / name
        return CheckpointConfig(folder, every_steps=self.recipe.training.checkpoint_every_steps)

    def share_encoding(self, model, texts, role: str = "document", *, batch_size: int = 64) -> None:
        """Under a multi-process launch, every process (each calls it with the same model and texts) encodes its
        share of the cache misses of ``texts``, recorded in ``train_log.json``; a no-op with one process."""
        import time

        t0 = time.perf_counter()
        report = share_encoding(model, texts, cache=self.cache, role=role, batch_size=batch_size,
                                show_progress=self.show_progress and self.is_main, state=self.accelerator)
        if report is not None:
            self.result.encode_seconds += time.perf_counter() - t0
            self.result.details.setdefault("shared_encoding", []).append(
                {"role": role, "unique": report.unique, "cached_before": report.cached_before,
                 "per_process": report.per_process, "seconds": report.seconds})

    def progress(self):
        """A ``progress(stage, step, total, row)`` callback drawing one rich bar (``None`` when quiet)."""
        if not (self.show_progress and self.is_main):
            return None
        return StepProgress()

    def train(self, model, stages, name: str | None = None, fingerprint: str | None = None):
        """:func:`medadapt.training.loop.train` with this run's seed, accelerator, checkpoints, fingerprint (or
        ``fingerprint``: what decides this phase's weights) and progress bar; the loss rows go to the result."""
        bar = self.progress()
        try:
            res = train(model, stages, seed=self.recipe.training.seed, accelerator=self.accelerator,
                        checkpoint=self.checkpoint(name), fingerprint=fingerprint or self.fingerprint, progress=bar)
        finally:
            if bar is not None:
                bar.close()
        self.result.loss_history += res.loss_history
        self.result.train_seconds += res.seconds
        return res


def checkpoint_dir_for(output_dir: Path) -> Path:
    """``runs/x`` -> ``runs/x.checkpoints`` (beside the model folder, never inside it)."""
    return output_dir.parent / f"{output_dir.name}.checkpoints"


#: A run folder (``medadapt train --output``): an existing non-empty folder is replaced only when it is a run.
RUN_FOLDER = FolderKind("a medadapt run", ("recipe.yaml",))


def _check_output(output_dir: Path) -> None:
    """The output policy for the run folder and its checkpoints beside it, before any work; leftovers of an
    interrupted save are cleaned."""
    check_output(output_dir, RUN_FOLDER, what="--output")
    checkpoints = output_dir.with_name(output_dir.name + ".checkpoints")
    if checkpoints.exists() and not checkpoints.is_dir():
        raise ConfigError(f"{checkpoints} (where the run keeps its checkpoints) is a file, not a folder")
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(output_dir)  # an interrupted save


def _accelerator(recipe: RecipeBase):
    import torch
    from accelerate import Accelerator

    device = recipe.training.device
    try:  # an unknown name (tpu) or a device this machine lacks (cuda, mps) stops here, before any work
        check_device(device)
    except ModelLoadError as exc:
        raise ConfigError(f"training.device: {exc}") from None
    if device not in (None, "cpu") and not str(device).startswith("cuda"):
        raise ConfigError(f"training.device is {device!r}: medadapt trains on cpu or cuda (Accelerate)")
    from accelerate.state import AcceleratorState, PartialState

    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision") != recipe.training.mixed_precision \
            and PartialState().num_processes == 1:
        # a second run in one Python process with another precision: Accelerate keeps its first state as a
        # process-wide singleton and would refuse; outside a multi-process launch it is safe to start anew
        AcceleratorState._reset_state()
    return Accelerator(cpu=device == "cpu" or not torch.cuda.is_available(),
                       mixed_precision=recipe.training.mixed_precision)


def run_recipe(
    recipe: RecipeBase | str | Path,
    output_dir: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    cache=None,
    show_progress: bool = True,
    evaluate: bool = True,
    overwrite: bool = False,
    log: Callable[[str], None] = print,
    **_: Any,
) -> RunResult:
    """Train what ``recipe`` (a validated recipe or a file) describes into ``output_dir`` (default
    ``runs/<name>``), save and evaluate it; ``overwrite`` discards another run's checkpoints there."""
    import torch

    if not isinstance(recipe, RecipeBase):
        recipe = load_recipe(recipe, overrides)
    elif overrides:
        raise ConfigError("overrides apply to a recipe file; pass a path or edit the recipe object")
    system = registry.get_kind(recipe.kind)  # through the module: tests replace it there
    if evaluate and system.evaluate is not None:
        check_also_sets(recipe)  # a missing extra evaluation set stops here, not after training
    output_dir = Path(output_dir) if output_dir is not None else Path("runs") / recipe.name
    accelerator = _accelerator(recipe)
    if accelerator.is_main_process:
        _check_output(output_dir)
    accelerator.wait_for_everyone()
    checkpoints = checkpoint_dir_for(output_dir)
    if overwrite and accelerator.is_main_process:
        shutil.rmtree(checkpoints, ignore_errors=True)
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        log, show_progress = (lambda _m: None), False
    torch.manual_seed(recipe.training.seed)
    result = RunResult(output_dir=output_dir)
    ctx = RunContext(recipe=recipe, output_dir=output_dir, checkpoint_dir=checkpoints, accelerator=accelerator,
                     cache=cache if cache is not None else EmbeddingCache(), result=result,
                     fingerprint=fingerprint(recipe), show_progress=show_progress, log=log,
                     evaluate=evaluate and system.evaluate is not None)
    model = result.model = system.train(recipe, ctx)
    adapter_only = bool(result.adapter_base) and recipe.save.adapter_only
    if isinstance(model, torch.nn.Module):  # whatever loop trained it, nothing non-finite is saved
        check_finite_parameters(model, f"the model folder {output_dir}")  # on every process: all stop together
    if accelerator.is_main_process:
        import yaml

        with replace_folder(output_dir, RUN_FOLDER, what="--output") as tmp:
            if adapter_only and hasattr(model, "save_adapter"):  # a composed model (e.g. a HyReC branch)
                model.save_adapter(tmp, base=result.adapter_base, name=output_dir.name)
            elif adapter_only:
                write_adapter(model, tmp, base=result.adapter_base, name=output_dir.name)
            else:
                model.save(str(tmp))
            atomic_write_text(tmp / "recipe.yaml",
                              yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
            atomic_write_json(tmp / "train_log.json", {
                "encode_seconds": round(result.encode_seconds, 2), "train_seconds": round(result.train_seconds, 2),
                "num_processes": accelerator.num_processes, "adapter_only": adapter_only,
                **_jsonable(result.details), "loss_history": result.loss_history})
    accelerator.wait_for_everyone()
    if evaluate and system.evaluate is not None and accelerator.is_main_process:
        result.record_metrics(system.evaluate(recipe, model, ctx), recipe.eval, output_dir)
        bases: dict[str, Any] = {}  # the frozen base model, loaded once for the eval split and every also set
        if recipe.eval.baseline:
            result.baseline = as_modes(result.metrics, _baseline_metrics(recipe, model, system, ctx, bases))
            if result.baseline:
                atomic_write_json(output_dir / "baseline_metrics.json", _rounded(result.baseline))
        if recipe.eval.also:
            _evaluate_also(recipe, model, system, ctx, bases)
        _warn_peers(recipe, ctx)
    if accelerator.is_main_process:
        _write_card(recipe, model, result, output_dir, adapter_only)
    return result


def _baseline_metrics(recipe: RecipeBase, model, system, ctx: RunContext,
                      bases: dict[str, Any] | None = None) -> dict[str, float]:
    """The frozen base model's metrics on the recipe's evaluation split: the trained model with its heads
    disabled, else the kind's ``base`` model or ``model.backbone`` (:func:`evaluate_dense`); empty without
    one. ``bases`` keeps a loaded base model between calls."""
    if adapter_names(model):
        model.disable_adapters()
        try:
            return dict(system.evaluate(recipe, model, ctx))
        finally:
            model.enable_adapters()
    bases = {} if bases is None else bases
    if "model" not in bases:
        bases["model"] = _base_model(recipe, system, ctx)
    return {} if bases["model"] is None else evaluate_dense(recipe, bases["model"], ctx)


def _base_model(recipe: RecipeBase, system, ctx: RunContext):
    """The kind's ``base`` hook, else the recipe's ``model.backbone`` loaded; ``None`` when neither names one."""
    if system.base is not None:
        return system.base(recipe, ctx)
    backbone = getattr(getattr(recipe, "model", None), "backbone", None)
    if not isinstance(backbone, str):
        return None
    return load(backbone, device=ctx.device)


def _evaluate_also(recipe: RecipeBase, model, system, ctx: RunContext, bases: dict[str, Any]) -> None:
    """Score the trained model and the frozen base on every ``eval.also`` set with the kind's own evaluation,
    rewrite ``metrics.json`` and log a warning per set where the trained model is below the base."""
    details = dict(ctx.result.details)  # a kind's evaluate notes its split's facts there (mode_metrics)
    try:
        ctx.result.also = evaluate_also_sets(
            recipe, lambda pointed: dict(system.evaluate(pointed, model, ctx)),
            lambda pointed: _baseline_metrics(pointed, model, system, ctx, bases))
    finally:
        ctx.result.details.clear()
        ctx.result.details.update(details)
    ctx.result.write_metrics(ctx.output_dir)
    if not any(row["base"] for row in ctx.result.also.values()):
        ctx.log(f"note: recipe kind {recipe.kind!r} names no frozen base model here; the eval.also sets show the "
                "trained model alone")
    for name, row in ctx.result.also.items():
        line = regression_warning(name, row, recipe.eval.metrics[0])
        if line is not None:
            ctx.result.warnings.append(line)
            ctx.log(line)


def _warn_peers(recipe: RecipeBase, ctx: RunContext) -> None:
    """A warning per peer baseline and set where it beats the trained model on the recipe's first metric."""
    metric, result = recipe.eval.metrics[0], ctx.result
    for peer, row in result.peers.items():
        sets = [(eval_set_name(recipe), result.metrics, row["metrics"])]
        sets += [(name, result.also.get(name, {}).get("trained", {}), scores)
                 for name, scores in row["also"].items()]
        for where, trained, scores in sets:
            line = peer_warning(peer, where, trained, scores, metric)
            if line is not None:
                result.warnings.append(line)
                ctx.log(line)


def _write_card(recipe: RecipeBase, model, result: RunResult, output_dir: Path, adapter_only: bool) -> None:
    """The model card of the run folder (:mod:`medadapt.cards`), with the metrics beside the baseline."""
    adapter = read_adapter_config(output_dir) if adapter_only else None
    ev = recipe.eval
    inner = getattr(model, "st", model)  # a composed model's dense side
    descriptions = describe_heads(inner) if hasattr(inner, "_modules") else {}
    write_card(output_dir, descriptions=descriptions, adapter=adapter, recipe=recipe.model_dump(mode="json"),
               metrics=result.metrics, baseline=result.baseline, eval_split=ev.split,
               data=ev.data or recipe.data.path, train_seconds=result.train_seconds, standalone=not adapter_only,
               also=result.also, peers=peers_as_modes(result.metrics, result.also, result.peers))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return obj


def evaluate_dense(recipe: RecipeBase, model, ctx: RunContext) -> dict[str, float]:
    """The evaluation most systems use: the retrieval task on ``eval.data`` (default: ``data.path``), split
    ``eval.split``, scored dense by :func:`medadapt.eval.tasks.evaluate` through the run's embedding cache."""
    ev = recipe.eval
    folder = recipe.resolve(ev.data or recipe.data.path)
    task = task_kind("retrieval").create(Path(folder).name or str(folder)).load_data(folder, ev.split)
    return evaluate(model, task, metrics=ev.metrics, mode="dense", cache=ctx.cache,
                    batch_size=recipe.training.encode_batch_size, show_progress=ctx.show_progress).metrics
