"""``medadapt report RUN_DIR``: one HTML page for a run folder (see :mod:`medadapt.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import (
    CacheDirOpt,
    QuietOpt,
    VerboseOpt,
    console,
    quiet_libraries,
    tagged,
    user_errors,
)
from medadapt.errors import MedAdaptError
from medadapt.io import check_output
from medadapt.report import build_report


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
    quiet_libraries()
    with user_errors():
        check_output(output, what="--output")
        if images is not None and images.exists() and not images.is_dir():
            raise MedAdaptError(f"--images {images} is a file; give a folder")

        def log(message: str) -> None:
            if not quiet:
                console.print(tagged("report:", "dim", message), highlight=False, soft_wrap=True)
        # the encoding bars are the embedding cache's own (shown only when the cache misses texts)
        path = build_report(run_dir, output, data=data, split=split, cache=EmbeddingCache(cache_dir), top=top,
                            top_negatives=negatives, images_dir=images, show_progress=not quiet, log=log)
    console.print(f"report written to {path}", highlight=False, soft_wrap=True)
