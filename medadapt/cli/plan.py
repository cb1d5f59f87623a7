"""``medadapt plan RECIPE.yaml``: its options; what it runs is :mod:`medadapt.cli._plan_run` (imported when it
runs, so ``--help`` imports no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from medadapt.cli._common import PaperOpt, SetOpt, body


def plan_cmd(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (see recipes/).")],
    accelerate_config: Annotated[Optional[Path], typer.Option(
        "--accelerate-config", help="Accelerate config YAML: number of processes, DDP / DeepSpeed ZeRO / FSDP "
        "sharding, mixed precision.")] = None,
    gpu_memory: Annotated[Optional[float], typer.Option("--gpu-memory", help="Memory per GPU in GB (GiB); "
                                                        "default 80.")] = None,
    num_gpus: Annotated[Optional[int], typer.Option("--num-gpus", help="GPUs (default: the accelerate config's "
                                                    "num_processes, else 1).")] = None,
    headroom: Annotated[float, typer.Option(help="Fraction of each GPU kept free (CUDA context, "
                                            "fragmentation, communication buffers).")] = 0.1,
    output: Annotated[Optional[Path], typer.Option("--output", help="Write the plan as JSON.")] = None,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print Markdown tables (for docs).")] = False,
    paper: PaperOpt = False,
    set_: SetOpt = None,
) -> None:
    """Plan a recipe before any download: parameters (trainable / frozen), memory per device, tokens per
    optimizer step and the gradient accumulation the paper's global batch needs; exit 1 with the reason
    when it cannot fit."""
    body("medadapt.cli._plan_run", "run_plan")(**locals())
