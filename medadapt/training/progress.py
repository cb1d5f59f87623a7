"""One rich progress bar for every training loop: ``progress(stage, step, total, row)`` callbacks."""

from __future__ import annotations

from typing import Any

__all__ = ["StepProgress"]


class StepProgress:
    """A rich bar fed by :func:`medadapt.training.loop.train`'s ``progress`` callback: stage, step of total,
    the loss and its named parts, time left. Call :meth:`close` when training ends."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeRemainingColumn(), transient=False)
        self.task = None
        self.bar.start()

    def __call__(self, stage: str, step: int, total: int, row: dict[str, Any]) -> None:
        if self.task is None:
            self.task = self.bar.add_task("training", total=total, info="")
        parts = [k for k in row if k not in ("stage", "step", "epoch", "loss", "lr")]
        info = f"loss {row['loss']:.4f}" + "".join(f" {k} {row[k]:.3f}" for k in parts[:3])
        self.bar.update(self.task, completed=step, description=f"training ({stage})", info=info)

    def close(self) -> None:
        self.bar.stop()
