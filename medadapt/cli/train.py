"""``medadapt train RECIPE.yaml``: its options; what it runs is :mod:`medadapt.cli._train_run` (imported when it
runs, so ``--help`` imports no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import CacheDirOpt, PaperOpt, QuietOpt, SetOpt, VerboseOpt, body


def train_cmd(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (see recipes/).")],
    output: Annotated[Optional[Path], typer.Option(help="Model folder to write (default runs/<recipe name>).")] = None,
    set_: SetOpt = None,
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
    paper: PaperOpt = False,
) -> None:
    """Train a head (or backbone / LoRA) as a recipe describes; resumes from OUTPUT.checkpoints after a kill.

    Runs on Accelerate: `accelerate launch -m medadapt train RECIPE` spreads it over GPUs / processes."""
    body("medadapt.cli._train_run", "run_train")(**locals())
