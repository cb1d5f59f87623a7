"""Shared CLI helpers: consoles, one-line errors, quiet third-party logging."""

from __future__ import annotations

import os

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def quiet_libraries() -> None:
    """Silence third-party warnings and progress bars so medadapt's own progress is what users see."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    from medadapt.errors import MedAdaptWarning

    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", category=MedAdaptWarning)  # medadapt's own recoveries stay visible
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass


def fail(message: str) -> None:
    """Print ``error: message`` on one stderr line and exit with code 1 (no traceback)."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1)
