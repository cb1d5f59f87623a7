"""What ``medadapt train RECIPE.yaml`` runs (its options: :mod:`medadapt.cli.train`): a recipe through
:mod:`medadapt.recipes.run`, then its metrics as a table."""

from __future__ import annotations

from pathlib import Path

import typer
from accelerate import PartialState
from rich.table import Table
from rich.text import Text

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import console, quiet_libraries, user_errors
from medadapt.recipes import load_recipe, run_recipe
from medadapt.training.distributed import closes_process_group


@closes_process_group
def run_train(recipe: Path, output: Path | None, set_: list[str] | None, no_eval: bool, check: bool,
              cache_dir: Path | None, quiet: bool, verbose: bool, overwrite: bool, full_model: bool,
              paper: bool) -> None:
    """``medadapt train``."""
    quiet_libraries()
    with user_errors(f"interrupted; run the same command again to resume from {output or 'runs/<name>'}.checkpoints"):
        overrides = [*(set_ or []), *(["save.adapter_only=false"] if full_model else [])]
        spec = load_recipe(recipe, overrides, paper=paper)  # `kind:` picks the system (medadapt.recipes.registry)
        result = run_recipe(spec, output or Path("runs") / spec.name, cache=EmbeddingCache(cache_dir),
                            show_progress=not quiet, evaluate=not no_eval, overwrite=overwrite,
                            log=lambda m: console.print(m, highlight=False, soft_wrap=True))
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
    """The run's metrics as a rich table: ``metric | frozen base | trained | change`` (the first two alone
    without a baseline), one column per peer, ``expected`` when the recipe sets it; then the ``eval.also`` sets
    in a section of their own (``<set> <metric>``). No column is ever left empty."""
    base = {m: result.baseline[m] for m in result.metrics if m in result.baseline}
    also = getattr(result, "also", None) or {}
    peers = getattr(result, "peers", None) or {}
    with_base = bool(base) or any(row.get("base") for row in also.values())
    table = Table(title=title)
    for column in ("metric", *(["frozen base"] if with_base else []), "trained", *(["change"] if with_base else []),
                   *peers, *(["expected"] if result.expected else [])):
        table.add_column(column, **({} if column == "metric" else {"justify": "right"}))

    def add(label: str, value: float, b: float | None, change: float | None, peer_values, expected: str) -> None:
        cells = [_cell(b), f"{value:.4f}", _change(change)] if with_base else [f"{value:.4f}"]
        table.add_row(label, *cells, *map(_cell, peer_values), *([expected] if result.expected else []))

    for metric, value in result.metrics.items():
        target = result.expected.get(metric)
        add(metric, value, base.get(metric), value - base[metric] if metric in base else None,
            [peer["metrics"].get(metric) for peer in peers.values()],
            "-" if target is None else "ok" if target[1] else f"off by {target[0] - value:.4f}")
    for n, (name, scores) in enumerate(also.items()):
        if n == 0:
            table.add_section()
        for metric, value in scores.get("trained", {}).items():
            add(f"{name} {metric}", value, scores.get("base", {}).get(metric), scores.get("delta", {}).get(metric),
                [peer["also"].get(name, {}).get(metric) for peer in peers.values()], "-")
    return table


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _change(change: float | None) -> str | Text:
    """A change column cell: green when up, red when down (beyond rounding), a dash when not measured."""
    if change is None:
        return "-"
    return Text(f"{change:+.4f}", style="green" if change > 5e-5 else "red" if change < -5e-5 else "")
