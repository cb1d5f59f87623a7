"""What ``medadapt encode`` runs (its options: :mod:`medadapt.cli.encode`): fill the embedding cache with a
corpus, on one process or split across the processes of ``accelerate launch``
(:func:`medadapt.encode.encode_corpus`); a killed run resumes where it stopped."""

from __future__ import annotations

from pathlib import Path

from medadapt.cache import EmbeddingCache
from medadapt.cli._common import console, quiet_libraries, user_errors
from medadapt.data.beir import load_beir
from medadapt.encode import encode_corpus, launch_state, process_device
from medadapt.io import atomic_write_json, check_output
from medadapt.models import check_device, load
from medadapt.training.distributed import closes_process_group


@closes_process_group
def run_encode(corpus: str, model: str, dtype, queries: bool, batch_size: int, chunk_size: int, device: str | None,
               cache_dir: Path | None, report: Path | None, quiet: bool, verbose: bool) -> None:
    """``medadapt encode`` (``dtype``: the command's choice)."""
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
