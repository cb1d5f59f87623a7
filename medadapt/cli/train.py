"""``medadapt train RECIPE.yaml``: run a recipe (see :mod:`medadapt.recipes.run`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from accelerate import PartialState
from rich.table import Table
from rich.text import Text

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import (
    CacheDirOpt,
    QuietOpt,
    VerboseOpt,
    closes_process_group,
    console,
    fail,
    quiet_libraries,
)
from medadapt.errors import MedAdaptError
from medadapt.recipes import load_recipe, run_recipe


@closes_process_group
def train_cmd(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (see recipes/).")],
    output: Annotated[Optional[Path], typer.Option(help="Model folder to write (default runs/<recipe name>).")] = None,
    set_: Annotated[
        Optional[list[str]], typer.Option("--set", help="Override a recipe field: section.field=value (repeatable).")
    ] = None,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the evaluation after training.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Exit with code 2 when a metric misses the recipe's eval.expected.")
    ] = False,
    cache_dir: CacheDirOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Discard checkpoints of an earlier, different run "
                                            "into the same output instead of refusing to resume them.")] = False,
    full_model: Annotated[bool, typer.Option("--full-model", help="Save a standalone folder with the backbone "
                                             "copied in, instead of the heads alone (save.adapter_only).")] = False,
    paper: Annotated[bool, typer.Option("--paper", help="Apply the paper's equations and hyperparameters (the "
                                        "system's paper settings, docs/recipes.md) on top of the recipe; --set "
                                        "still wins.")] = False,
) -> None:
    """Train a head (or backbone / LoRA) as a recipe describes; resumes from OUTPUT.checkpoints after a kill.

    Runs on Accelerate: `accelerate launch -m medadapt train RECIPE` spreads it over GPUs / processes."""
    quiet_libraries()
    try:
        overrides = [*(set_ or []), *(["save.adapter_only=false"] if full_model else [])]
        spec = load_recipe(recipe, overrides, paper=paper)  # `kind:` picks the system (medadapt.recipes.registry)
        result = run_recipe(spec, output or Path("runs") / spec.name, cache=EmbeddingCache(cache_dir),
                            show_progress=not quiet, evaluate=not no_eval, overwrite=overwrite,
                            log=lambda m: console.print(m, highlight=False, soft_wrap=True))
    except MedAdaptError as exc:
        fail(str(exc))
        return
    except OSError as exc:  # a file system error (a cache folder that is a file, a full disk) not turned into one
        fail(f"{exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        return
    except KeyboardInterrupt:
        fail(f"interrupted; run the same command again to resume from {output or 'runs/<name>'}.checkpoints")
        return

    if not PartialState().is_main_process:  # under `accelerate launch`, one summary from the main process
        return
    if result.loss_history:
        console.print(f"loss {result.loss_history[0]['loss']:.4f} -> {result.loss_history[-1]['loss']:.4f} "
                      f"in {result.train_seconds:.1f} s (encoding {result.encode_seconds:.1f} s)")
    if result.metrics:
        console.print(result_table(result, f"{spec.name}: {spec.eval.data or spec.data.path} / {spec.eval.split}"))
    what = "adapter (heads only)" if (result.output_dir / "medadapt_adapter.json").is_file() else "model"
    console.print(f"saved {what} to {result.output_dir}  (load with medadapt.load('{result.output_dir}'))")
    if check and any(not ok for _, ok in result.expected.values()):
        raise typer.Exit(code=2)


def result_table(result, title: str):
    """The run's metrics as a rich table: ``metric | frozen base | trained | change`` when the run evaluated
    the frozen base model (``eval.baseline``, ``eval.also``), else ``metric | trained``; plus an ``expected``
    column (``ok`` / ``off by X``) only when the recipe sets ``eval.expected``, and one column per peer
    baseline (``eval.peers``, trained in the same run) after ``change``. The ``eval.also`` sets follow in a
    section of their own, one row per set and metric (``<set> <metric>``). No column is ever left empty."""
    table = Table(title=title)
    table.add_column("metric")
    base = {m: result.baseline[m] for m in result.metrics if m in result.baseline}
    also = getattr(result, "also", None) or {}
    with_base = bool(base) or any(row.get("base") for row in also.values())
    if with_base:
        table.add_column("frozen base", justify="right")
    table.add_column("trained", justify="right")
    if with_base:
        table.add_column("change", justify="right")
    peers = getattr(result, "peers", None) or {}
    for label in peers:
        table.add_column(label, justify="right")
    if result.expected:
        table.add_column("expected", justify="right")
    for metric, value in result.metrics.items():
        row = [metric]
        if with_base:
            row.append(f"{base[metric]:.4f}" if metric in base else "-")
        row.append(f"{value:.4f}")
        if with_base:
            row.append(_change(value - base[metric] if metric in base else None))
        row += [_cell(peer["metrics"].get(metric)) for peer in peers.values()]
        if result.expected:
            target = result.expected.get(metric)
            row.append("-" if target is None else "ok" if target[1] else f"off by {target[0] - value:.4f}")
        table.add_row(*row)
    for n, (name, scores) in enumerate(also.items()):
        if n == 0:
            table.add_section()
        for metric, value in scores.get("trained", {}).items():
            b = scores.get("base", {}).get(metric)
            row = [f"{name} {metric}"]
            if with_base:
                row.append("-" if b is None else f"{b:.4f}")
            row.append(f"{value:.4f}")
            if with_base:
                row.append(_change(scores.get("delta", {}).get(metric)))
            row += [_cell(peer["also"].get(name, {}).get(metric)) for peer in peers.values()]
            if result.expected:
                row.append("-")
            table.add_row(*row)
    return table


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _change(change: float | None) -> str | Text:
    """A change column cell: green when up, red when down (beyond rounding), a dash when not measured."""
    if change is None:
        return "-"
    return Text(f"{change:+.4f}", style="green" if change > 5e-5 else "red" if change < -5e-5 else "")
