"""Shared helpers for benchmark scripts: argument conventions, table printing, JSON output.

Convention: every script takes ``--data-dir`` (default ``../shared/data``) and ``--output FILE.json``,
prints its table, writes the same figures as JSON, and exits non-zero on failure.
"""

from __future__ import annotations

import argparse
import platform
import shlex
import sys
import time
from pathlib import Path

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR, help="folder holding the BEIR datasets")
    p.add_argument("--output", type=Path, default=None, help="write results as JSON here")
    return p


def machine() -> dict:
    import os

    import torch

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def command_line() -> str:
    """This run's command, shell-quoted so that it re-runs as written (labels with spaces included)."""
    return shlex.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])


def finish(args, rows: list[dict], columns: list[str], extra: dict | None = None) -> None:
    print(markdown_table(rows, columns))
    payload = {
        "command": command_line(),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
        "rows": rows,
        **(extra or {}),
    }
    if args.output:
        from medadapt.io import atomic_write_json

        atomic_write_json(args.output, payload)
        print(f"wrote {args.output}")


class Timer:
    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def best_time(fn, repeats: int, warmup: bool = False) -> float:
    """Fastest of ``repeats`` wall-clock runs of ``fn()`` in seconds (after one untimed run with ``warmup``)."""
    if warmup:
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
