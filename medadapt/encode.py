"""Encode a corpus into the embedding cache, split across the processes of an ``accelerate launch``.

``medadapt encode`` (and :func:`encode_corpus` behind it) fills the :class:`~medadapt.cache.EmbeddingCache`
namespace that evaluation, indexing and training read, so those steps find every document cached. Under
``accelerate launch --num_processes N`` (GPUs, or CPU processes) the work is shared:

1. The main process indexes the namespace's verified shards (:class:`~medadapt.cache.ShardIndex`) and
   finds the distinct texts not cached yet; their positions are broadcast, so every process works from the
   same list whatever it would have seen itself.
2. Process ``r`` encodes every ``N``-th of them (longest first, so each process gets a similar mix of
   lengths) in chunks of ``cache.chunk_size``, each chunk written as its own shard (temp file + rename,
   SHA-256 inside). The processes hold the namespace lock *shared*: they write disjoint texts, and a plain
   writer (``EmbeddingCache.encode`` elsewhere) waits for them, then encodes only what is still missing.
3. A barrier, then the main process indexes again: anything still missing (a shard found corrupt and set
   aside, a process that wrote nothing) goes round again; a run ends when nothing is missing.

A killed run leaves complete shards only (a reader never sees a partial one) and loses at most the chunk
each process had in flight; the same command resumes from the shards. Rows do not depend on how texts
were split: each text's embedding is what one process encoding the whole corpus stores, up to the float
rounding of a different padding length in its encode batch (within 1e-6).

Why hand-written: Accelerate shares out the batches of a training loop (``split_between_processes``) but
has no notion of work that is already done, nor of a resumable, content-keyed result store; the split
below is a few lines on top of Accelerate's own collectives (``broadcast_object_list``, ``gather_object``,
``wait_for_everyone``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from medadapt.cache import (
    _MAX_ROUNDS,
    EmbeddingCache,
    Role,
    ShardIndex,
    effective_prompt,
    hash_keys,
    namespace_lock,
    text_hash,
)
from medadapt.data.beir import load_beir
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_write_json

__all__ = ["EncodeReport", "corpus_texts", "encode_corpus", "launch_state", "launched_processes",
           "process_device", "share_encoding"]


@dataclass
class EncodeReport:
    """What :func:`encode_corpus` did (the same on every process).

    Attributes:
        namespace / folder / dtype: the cache namespace filled and its storage dtype.
        texts / unique: texts given, distinct texts among them.
        cached_before: distinct texts already cached when the run started (a resumed run's earlier work).
        encoded: texts encoded by this run, all processes together; ``per_process`` splits it by rank.
        rounds: passes that found texts to encode (0: all were cached; 1 normally; more when a corrupt
            shard had to be re-encoded).
        seconds: wall time of the whole call.
    """

    namespace: str
    folder: str
    dtype: str
    texts: int
    unique: int
    cached_before: int
    encoded: int
    processes: int
    per_process: list[int] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def corpus_texts(path: str | Path) -> list[str]:
    """The document texts of a BEIR folder (or builtin dataset name) exactly as evaluation encodes them
    (title and text joined, :meth:`medadapt.data.BeirDataset.doc_text`), in corpus order."""
    return load_beir(path, splits=[]).doc_texts()


def launched_processes() -> int:
    """How many processes the current launch runs (``WORLD_SIZE``, set by ``accelerate launch`` / torchrun;
    1 for a plain ``python`` / ``medadapt`` run). Reads the environment only: no process group is started."""
    import os

    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def launch_state(device: str | None = None):
    """Accelerate's process state for a command run under ``accelerate launch``: CPU processes (gloo) for
    ``device="cpu"`` or without CUDA, else one GPU per process."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=device == "cpu" or not torch.cuda.is_available())


def process_device(state, device: str | None) -> str | None:
    """The device this process of a launch should load its model on: its own GPU (``state.device``) when
    ``device`` is unset or ``"cuda"`` and the launch runs on GPUs, else ``device`` as given."""
    if device in (None, "cuda") and state.device.type != "cpu":
        return str(state.device)
    return device


def share_encoding(model, texts: Sequence[str], *, cache: EmbeddingCache, role: Role = "document",
                   prompt: str | None = None, prompt_name: str | None = None, batch_size: int = 64,
                   show_progress: bool = True, state=None) -> EncodeReport | None:
    """The encode step of evaluation, indexing and training under ``accelerate launch``: every process of
    the launch calls this with the same model and texts, and :func:`encode_corpus` shares the cache misses
    out among them, so that the step that follows (run by the main process alone, or by every process inside
    ``main_process_first``) finds every text cached. With one process it does nothing and returns ``None``:
    that step's own ``EmbeddingCache.encode`` encodes the misses as before.

    ``state``: an Accelerate state (an ``Accelerator`` works); default :func:`launch_state` when the
    environment says more than one process was launched."""
    if state is None:
        if launched_processes() <= 1:
            return None
        state = launch_state()
    if state.num_processes <= 1:
        return None
    return encode_corpus(model, texts, cache=cache, role=role, prompt=prompt, prompt_name=prompt_name,
                         batch_size=batch_size, show_progress=show_progress, state=state)


def _state(state):
    if state is not None:
        return state
    from accelerate import PartialState

    return PartialState()


def encode_corpus(
    model,
    texts: Sequence[str],
    *,
    cache: EmbeddingCache | None = None,
    role: Role = "document",
    prompt: str | None = None,
    prompt_name: str | None = None,
    batch_size: int = 64,
    show_progress: bool = True,
    state=None,
) -> EncodeReport:
    """Make every text of ``texts`` cached for ``model`` and ``role``, sharing the work among the processes
    of the current Accelerate launch (one process: all of it). Returns no embeddings: read them with
    :meth:`EmbeddingCache.view` / :meth:`~EmbeddingCache.iter_embeddings` / :meth:`~EmbeddingCache.encode`.

    Every process must call it with the same model weights and the same texts.

    Args:
        model: a ``SentenceTransformer`` (an asymmetric model is cached per route, as the cache does).
        texts: the corpus (``role="document"``) or queries (``role="query"``).
        cache: where to store (default ``EmbeddingCache()``; its ``dtype`` and ``chunk_size`` apply).
        state: an ``accelerate`` ``PartialState`` (default: the current one).

    Raises:
        MedAdaptError: the processes hold different models or texts, or the cache keeps yielding corrupt
            shards.
    """
    from accelerate.utils import broadcast_object_list, gather_object

    t0 = time.perf_counter()
    state = _state(state)
    cache = cache if cache is not None else EmbeddingCache()
    rank, world = state.process_index, state.num_processes
    texts = texts if isinstance(texts, list) else list(texts)
    if role not in ("query", "document", "plain"):
        raise ValueError(f"role must be 'query', 'document' or 'plain', got {role!r}")
    eff_prompt = effective_prompt(model, role, prompt, prompt_name)
    encoder = cache.encoder_for(model, role)
    ns, meta = cache.namespace(encoder, role, eff_prompt)
    ns_dir = cache.root / ns

    hashes = [text_hash(t) for t in texts]
    keys = hash_keys(hashes)
    _, first = np.unique(keys, return_index=True)
    first.sort()  # the distinct texts, in corpus order
    if world > 1:  # every process must fill the same namespace with the same texts
        import hashlib

        corpus_digest = hashlib.sha256(keys[first].tobytes()).hexdigest()
        mine = [(ns, corpus_digest)]
        every = gather_object(mine)
        if any(e != mine[0] for e in every):
            raise MedAdaptError("the processes of this launch hold different models or texts: "
                                f"(namespace, corpus digest) per process {every}; give each the same")
    if state.is_main_process:
        ns_dir.mkdir(parents=True, exist_ok=True)
        if not (ns_dir / "meta.json").exists():
            atomic_write_json(ns_dir / "meta.json", meta)
    state.wait_for_everyone()

    encoded_here = 0
    cached_before = None
    rounds = 0  # passes that found texts to encode
    for _ in range(_MAX_ROUNDS + 1):
        todo = [None]
        if state.is_main_process:
            shard, _ = ShardIndex.build(cache, ns_dir).lookup(keys[first])
            todo = [first[shard < 0]]
        if world > 1:
            broadcast_object_list(todo)
        missing = todo[0]
        if cached_before is None:
            cached_before = len(first) - len(missing)
        if not len(missing):
            break
        rounds += 1
        order = sorted(missing.tolist(), key=lambda i: (-len(texts[i]), hashes[i]))  # the same on every rank
        mine = {hashes[i]: texts[i] for i in order[rank::world]}
        if mine:
            desc = f"encoding ({role})" + (f" [process {rank}/{world}]" if world > 1 else "")
            # ranks write disjoint texts: a shared lock keeps plain writers out, not each other; one process
            # takes the usual exclusive lock and looks again under it (another writer may have just finished)
            with namespace_lock(ns_dir, shared=world > 1):
                if world == 1:
                    mine_keys = hash_keys(list(mine))
                    still = ShardIndex.build(cache, ns_dir).lookup(mine_keys)[0] < 0
                    mine = {h: mine[h] for h, s in zip(mine, still) if s}
                if mine:
                    cache._encode_locked(encoder, ns_dir, mine, role, eff_prompt, batch_size,
                                         show_progress and state.is_main_process, desc)
            encoded_here += len(mine)
        state.wait_for_everyone()
    else:
        raise MedAdaptError(f"the embedding cache folder {ns_dir} keeps yielding corrupt or vanishing shards "
                            f"({_MAX_ROUNDS} attempts); check the disk, or delete the folder")
    per_process = [int(n) for n in gather_object([encoded_here])] if world > 1 else [encoded_here]
    return EncodeReport(namespace=ns, folder=str(ns_dir), dtype=cache.dtype, texts=len(texts), unique=len(first),
                        cached_before=int(cached_before), encoded=sum(per_process), processes=world,
                        per_process=per_process, rounds=rounds, seconds=round(time.perf_counter() - t0, 3))
