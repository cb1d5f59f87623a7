"""What ``medadapt report RUN_DIR`` runs (its options: :mod:`medadapt.cli.report`): one HTML page for a run
folder (see :mod:`medadapt.report`)."""

from __future__ import annotations

from pathlib import Path

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import console, quiet_libraries, tagged, user_errors
from medadapt.errors import MedAdaptError
from medadapt.io import check_output
from medadapt.report import build_report


def run_report(run_dir: Path, output: Path | None, data: str | None, split: str | None, top: int, negatives: int,
               images: Path | None, cache_dir: Path | None, quiet: bool, verbose: bool) -> None:
    """``medadapt report``."""
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
