"""What ``medadapt plan RECIPE.yaml`` runs (its options: :mod:`medadapt.cli.plan`): parameters, memory per
device, tokens per step and gradient accumulation on the declared hardware, from architecture configs only
(see :mod:`medadapt.plan`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rich.table import Table
from rich.text import Text

from medadapt.cli._common import console, fail, quiet_libraries, user_errors
from medadapt.io import atomic_write_json
from medadapt.plan import Hardware, plan_recipe, read_accelerate_config
from medadapt.plan.planner import _n
from medadapt.recipes import load_recipe


def run_plan(recipe: Path, accelerate_config: Path | None, gpu_memory: float | None, num_gpus: int | None,
             headroom: float, output: Path | None, markdown: bool, paper: bool, set_: list[str] | None) -> None:
    """``medadapt plan``."""
    quiet_libraries()
    with user_errors():
        spec = load_recipe(recipe, list(set_ or []), paper=paper)
        hw = read_accelerate_config(accelerate_config) if accelerate_config else Hardware(gpu_memory_gb=80.0)
        hw = replace(hw.with_overrides(num_gpus=num_gpus, gpu_memory_gb=gpu_memory), headroom=headroom)
        plan = plan_recipe(spec, hw, strict=False)
        if output is not None:
            atomic_write_json(output, plan.to_dict())
    if markdown:
        console.print(plan.to_markdown(), highlight=False, markup=False, soft_wrap=True)
    else:
        _print_tables(plan)
    if not plan.fits:
        fail(f"{plan.recipe} cannot fit on {plan.hardware}: " + "; ".join(f"{p.name}: {p.reason}"
                                                                            for p in plan.phases if not p.fits))


def _print_tables(plan) -> None:
    """The models as a table, each phase as a short block (readable in an 80-column terminal)."""
    models = Table(title=f"{plan.recipe}: models")
    for col in ("model", "architecture", "parameters", "trainable", "frozen", "trains as"):
        models.add_column(col, justify="right" if col in ("parameters", "trainable", "frozen") else "left")
    for m in plan.models:
        models.add_row(m.role, m.model or "-", _n(m.total_params), _n(m.trainable_params), _n(m.frozen_params), m.how)
    console.print(models)
    console.print(f"per device on {plan.hardware} (usable {plan.usable_gb:.1f} GB each):", highlight=False)
    for p in plan.phases:
        tokens = f"{_n(p.tokens_per_step)} tokens / step" if p.tokens_per_step else "cached inputs"
        act = (f"{p.activations_per_example_gb:.3f} GB / example with gradient checkpointing, "
               f"{p.activations_per_example_no_ckpt_gb:.3f} without" if p.checkpointing else
               f"{p.activations_per_example_no_ckpt_gb:.3f} GB / example (no gradient checkpointing)")
        lines = [Text.assemble((p.name, "bold"), f": global batch {p.global_batch}, {tokens}"),
                 f"  state: weights {p.weights_gb:.2f} + gradients {p.gradients_gb:.2f} + optimizer "
                 f"{p.optimizer_gb:.2f} + other {p.extra_gb + p.embeddings_gb:.2f} GB",
                 f"  activations: {act}"]
        if p.fits:
            lines.append(Text.assemble(f"  micro-batch {p.micro_batch} per GPU x {p.accumulation} accumulation "
                                       f"step(s): peak {p.peak_gb:.1f} GB  ", ("fits", "green")))
            if p.accumulation > p.declared_accumulation:
                lines.append(f"  the recipe declares {p.declared_accumulation}: set {p.recipe_fix()}")
        else:
            lines.append(Text.assemble("  ", ("does not fit", "red"), f": {p.reason}"))
        for line in lines:
            console.print(line, highlight=False)
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False)
    for line in plan.data:
        console.print(f"data: {line}", highlight=False)
