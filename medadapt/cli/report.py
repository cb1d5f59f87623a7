"""``medadapt report RUN_DIR``: its options; what it runs is :mod:`medadapt.cli._report_run` (imported when it
runs, so ``--help`` imports no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import CacheDirOpt, QuietOpt, VerboseOpt, body


def report_cmd(
    run_dir: Annotated[Path, typer.Argument(help="Run folder written by `medadapt train`.")],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="HTML file to write "
                                                   "(default RUN_DIR/report.html).")] = None,
    data: Annotated[Optional[str], typer.Option(
        help="BEIR folder (or builtin name) for the score distribution and per-query comparison "
             "(default: the recipe's evaluation data).")] = None,
    split: Annotated[Optional[str], typer.Option(
        help="Split of the data (default: the recipe's eval.split).")] = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Queries in each gained / lost table.")] = 10,
    negatives: Annotated[int, typer.Option(min=1, max=1000, help="Hard negatives per query in the score "
                                           "distribution.")] = 5,
    images: Annotated[Optional[Path], typer.Option(help="Also write every figure as a PNG into this "
                                                   "folder.")] = None,
    cache_dir: CacheDirOpt = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Write an HTML report of a training run: loss curves, expert load, positive vs hard-negative scores,
    metrics vs the frozen baseline, and the queries that gained or lost most."""
    body("medadapt.cli._report_run", "run_report")(**locals())
