"""``medadapt encode``: its options; what it runs is :mod:`medadapt.cli._encode_run` (imported when it runs, so
``--help`` imports no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from medadapt.cli._common import CacheDirOpt, QuietOpt, VerboseOpt, body, choices

StorageDtype = choices("StorageDtype", "float32", "float16")


def encode_cmd(
    corpus: Annotated[str, typer.Option(help="BEIR folder (corpus.jsonl, queries.jsonl) or builtin dataset.")],
    model: Annotated[str, typer.Option(help="Model alias (minilm), saved model folder, or hub id.")] = "minilm",
    dtype: Annotated[StorageDtype, typer.Option(help="Storage dtype of the cached embeddings.")] = (
        StorageDtype.float32),
    queries: Annotated[bool, typer.Option("--queries", help="Also encode the queries (role query).")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Encoding batch size per process.")] = 64,
    chunk_size: Annotated[int, typer.Option(min=1, help="Texts per cache shard (the most a kill can lose "
                                                        "per process).")] = 1024,
    device: Annotated[str | None, typer.Option(help="cpu, cuda ... (default: one GPU per process if "
                                                       "CUDA is available, else CPU).")] = None,
    cache_dir: CacheDirOpt = None,
    report: Annotated[Path | None, typer.Option(help="Write what was done as JSON here.")] = None,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Encode a corpus into the embedding cache (resumable; split across `accelerate launch` processes)."""
    body("medadapt.cli._encode_run", "run_encode")(**locals())
