"""Encode a corpus into the embedding cache, split across the processes of an ``accelerate launch``
(``medadapt encode``, and the encode step of eval, index and train; docs/cache.md).

The main process finds the texts not cached yet and broadcasts them; process ``r`` encodes every ``N``-th
(longest first) into its own shards under the *shared* namespace lock; after a barrier anything still
missing goes round again. Hand-written because Accelerate has no notion of work already done: a few lines
on its collectives (``broadcast_object_list``, ``gather_object``, ``wait_for_everyone``).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from medadapt.cache import (_MAX_ROUNDS, EmbeddingCache, Role, ShardIndex, _check_role, _ensure_namespace, _gave_up,
                            effective_prompt, hash_keys, namespace_lock, text_hash)
from medadapt.data.beir import load_beir
from medadapt.errors import MedAdaptError

__all__ = ["EncodeReport", "corpus_texts", "encode_corpus", "launch_state", "launched_processes",
           "process_device", "share_encoding"]


@dataclass
class EncodeReport:
    """What :func:`encode_corpus` did (the same on every process): the namespace filled, texts given and
    distinct, those cached before (a resumed run's work), encoded (all processes; ``per_process`` by rank),
    ``rounds`` that found texts to encode (more than 1 when a corrupt shard was re-encoded), wall time."""

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
    """A BEIR folder's (or builtin set's) document texts as evaluation encodes them, in corpus order."""
    return load_beir(path, splits=[]).doc_texts()


def launched_processes() -> int:
    """How many processes the current launch runs (``WORLD_SIZE``; 1 without a launch); starts nothing."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def launch_state(device: str | None = None):
    """Accelerate's process state under a launch: CPU processes for ``device="cpu"`` or without CUDA, else
    one GPU per process."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=device == "cpu" or not torch.cuda.is_available())


def process_device(state, device: str | None) -> str | None:
    """This process's device: its own GPU when ``device`` is unset or ``"cuda"`` on a GPU launch, else ``device``."""
    if device in (None, "cuda") and state.device.type != "cpu":
        return str(state.device)
    return device


def share_encoding(model, texts: Sequence[str], *, cache: EmbeddingCache, role: Role = "document",
                   prompt: str | None = None, prompt_name: str | None = None, batch_size: int = 64,
                   show_progress: bool = True, state=None) -> EncodeReport | None:
    """The encode step of eval, index and train under ``accelerate launch``: every process calls this with
    the same model and texts and :func:`encode_corpus` shares out the misses, so the step that follows finds
    every text cached. With one process: ``None``, nothing done. ``state``: an Accelerate state (default
    :func:`launch_state` when more than one process was launched)."""
    if state is None:
        if launched_processes() <= 1:
            return None
        state = launch_state()
    if state.num_processes <= 1:
        return None
    return encode_corpus(model, texts, cache=cache, role=role, prompt=prompt, prompt_name=prompt_name,
                         batch_size=batch_size, show_progress=show_progress, state=state)


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
    """Make every text cached for ``model`` and ``role``, shared among the processes of the current launch,
    each called with the same weights and texts (else a :class:`MedAdaptError`). Returns counts, not
    embeddings (read them with :meth:`EmbeddingCache.view`). ``cache``: default ``EmbeddingCache()``;
    ``state``: an ``accelerate`` ``PartialState`` (default: the current one)."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list, gather_object

    t0 = time.perf_counter()
    state = state if state is not None else PartialState()
    cache = cache if cache is not None else EmbeddingCache()
    rank, world = state.process_index, state.num_processes
    texts = texts if isinstance(texts, list) else list(texts)
    _check_role(role)
    eff_prompt = effective_prompt(model, role, prompt, prompt_name)
    encoder = cache.encoder_for(model, role)
    ns, meta = cache.namespace(encoder, role, eff_prompt)
    ns_dir = cache.root / ns

    hashes = [text_hash(t) for t in texts]
    keys = hash_keys(hashes)
    _, first = np.unique(keys, return_index=True)
    first.sort()  # the distinct texts, in corpus order
    if world > 1:  # every process must fill the same namespace with the same texts
        corpus_digest = hashlib.sha256(keys[first].tobytes()).hexdigest()
        mine = [(ns, corpus_digest)]
        every = gather_object(mine)
        if any(e != mine[0] for e in every):
            raise MedAdaptError("the processes of this launch hold different models or texts: "
                                f"(namespace, corpus digest) per process {every}; give each the same")
    if state.is_main_process:
        _ensure_namespace(ns_dir, meta)
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
            show = show_progress and state.is_main_process
            if world == 1:  # the usual exclusive lock, looking again under it (another writer may have finished)
                encoded_here += cache._encode_missing(encoder, ns_dir, mine, role, eff_prompt, batch_size, show, desc)
            else:  # ranks write disjoint texts: a shared lock keeps plain writers out, not each other
                with namespace_lock(ns_dir, shared=True):
                    cache._encode_locked(encoder, ns_dir, mine, role, eff_prompt, batch_size, show, desc)
                encoded_here += len(mine)
        state.wait_for_everyone()
    else:
        raise _gave_up(ns_dir)
    per_process = [int(n) for n in gather_object([encoded_here])] if world > 1 else [encoded_here]
    return EncodeReport(namespace=ns, folder=str(ns_dir), dtype=cache.dtype, texts=len(texts), unique=len(first),
                        cached_before=int(cached_before), encoded=sum(per_process), processes=world,
                        per_process=per_process, rounds=rounds, seconds=round(time.perf_counter() - t0, 3))
