"""The training loop's bar: ``progress(stage, step, total, row)`` callbacks drawn in medadapt's one progress
display (:mod:`medadapt.progress`)."""

from __future__ import annotations

from typing import Any

from medadapt.progress import Bar

__all__ = ["StepProgress"]


class StepProgress:
    """A bar fed by :func:`medadapt.training.loop.train`'s ``progress`` callback: stage, step of total, the
    loss and its named parts, time left. Call :meth:`close` when training ends."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, stage: str, step: int, total: int, row: dict[str, Any]) -> None:
        if self.bar is None:
            self.bar = Bar(total=total, desc="training", unit="step")
        parts = [k for k in row if k not in ("stage", "step", "epoch", "loss", "lr")]
        self.bar.set_info(f"loss {row['loss']:.4f}" + "".join(f" {k} {row[k]:.3f}" for k in parts[:3]))
        self.bar.set_state(step, total, desc=f"training ({stage})")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
