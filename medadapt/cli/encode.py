"""``medadapt encode``: fill the embedding cache with a corpus, on one process or split across the processes
of ``accelerate launch`` (:func:`medadapt.encode.encode_corpus`); a killed run resumes where it stopped."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import (
    CacheDirOpt,
    QuietOpt,
    VerboseOpt,
    choices,
    closes_process_group,
    console,
    quiet_libraries,
    user_errors,
)
from medadapt.data.beir import load_beir
from medadapt.encode import encode_corpus, launch_state, process_device
from medadapt.io import atomic_write_json, check_output
from medadapt.models import check_device, load

StorageDtype = choices("StorageDtype", "float32", "float16")


@closes_process_group
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
    quiet_libraries()
    with user_errors("interrupted; run the same command again to resume (finished shards are kept)"):
        check_device(device)  # before reading data or loading a model
        check_output(report, what="--report")
        state = launch_state(device)
        data = load_beir(corpus, splits=[])
        st = load(model, device=process_device(state, device) or "cpu")
        cache = EmbeddingCache(cache_dir, chunk_size=chunk_size, dtype=dtype.value)
        jobs = [("document", data.doc_texts())]
        if queries:
            jobs.append(("query", list(data.queries.values())))
        done = [encode_corpus(st, texts, cache=cache, role=role, batch_size=batch_size,
                              show_progress=not quiet, state=state) for role, texts in jobs]
    if not state.is_main_process:  # one summary, from the main process
        return
    for (role, _), r in zip(jobs, done):
        split = ", ".join(f"process {i}: {n}" for i, n in enumerate(r.per_process)) if r.processes > 1 else ""
        rate = f", {r.encoded / r.seconds:.1f} texts/s" if r.encoded and r.seconds else ""
        console.print(f"{'queries' if role == 'query' else 'documents'}: {r.unique} distinct texts cached ({r.dtype}) in {r.folder}; encoded "
                      f"{r.encoded}{f' ({split})' if split else ''}, {r.cached_before} already cached; "
                      f"{r.seconds:.1f} s{rate}", highlight=False, soft_wrap=True)
    if report is not None:
        atomic_write_json(report, {role: r.to_dict() for (role, _), r in zip(jobs, done)})
