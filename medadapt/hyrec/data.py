"""Training data for HyReC: (query, positive, hard negatives) triples, union labels, and the shared-state
cache of the frozen variant.

* :func:`build_examples` turns a BEIR split into :class:`Example` s, with hard negatives mined by
  :mod:`medadapt.curation` in the paper's ANN window (Appendix B: ranks 20-100): dense
  (:class:`~medadapt.curation.dense.DenseSearcher` on a frozen embedder through the EmbeddingCache) or BM25
  (:class:`~medadapt.curation.bm25.BM25Searcher`, for languages where the frozen embedder is useless).
* :class:`SharedStateCache` stores the frozen sharing backbone's token states (fp16) per text, keyed on the
  backbone fingerprint, the token limit and the text hash, in memory and optionally on disk as a token-states
  namespace of the :class:`~medadapt.cache.EmbeddingCache` (checksummed safetensors shards), so the corpus
  is pushed through the frozen layers once for every training epoch, every ablation and the evaluation.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import tempfile
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from medadapt import models
from medadapt.cache import EmbeddingCache, default_cache_dir
from medadapt.curation.bm25 import BM25Searcher
from medadapt.curation.dense import DenseSearcher
from medadapt.curation.mining import mine_hard_negatives
from medadapt.curation.mining_config import MiningConfig
from medadapt.data import load_beir
from medadapt.data.training import load_training_groups
from medadapt.errors import DataError, MedAdaptError, warn
from medadapt.hyrec.labels import IGNORE, UnionLabeler
from medadapt.identity import modules_fingerprint
from medadapt.identity import weights_version as _versions
from medadapt.io import atomic_open
from medadapt.progress import progress

__all__ = ["Example", "SharedStateCache", "UnionLabelCache", "build_examples", "filter_pairs", "load_pairs",
           "remine_negatives", "score_pairs"]


@dataclass
class Example:
    query: str
    positive: str
    negatives: list[str] = field(default_factory=list)


def share_miner_encoding(ctx, data, negatives: str, num: int, miner_model):
    """The dense miner :func:`build_examples` will use, loaded now on the run's device (``ctx.device``: each
    process's own GPU); with more than one process, every process then encodes its share of the corpus with
    it (``ctx.share_encoding``; the system's ``main_process_first`` block then mines from the cache). No
    dense mining: ``miner_model`` unchanged. (Left to :func:`build_examples`, a named miner was loaded on
    the CPU: on an H100 machine HyReC spent 257 s encoding 1,024 documents before its first step.)"""
    if not num or negatives != "dense":
        return miner_model
    miner = models.load(miner_model, device=ctx.device) if isinstance(miner_model, str) else miner_model
    if ctx.accelerator.num_processes > 1:
        ctx.share_encoding(miner, data.doc_texts())
    return miner


def build_examples(data, split: str, *, negatives: Literal["dense", "bm25", "none"] = "dense",
                   window: tuple[int, int] = (20, 100), num_negatives: int = 3,
                   max_queries: int | None = None, miner_model="minilm",
                   language: Literal["zh", "en"] = "en", cache=None, seed: int = 42,
                   show_progress: bool = True, device: str | None = None) -> list[Example]:
    """One :class:`Example` per (query, positive) of ``split`` (queries sampled down to ``max_queries``);
    ``miner_model``: the dense miner's name (``medadapt.load``, onto ``device``: default
    sentence-transformers' choice, a GPU when there is one) or a SentenceTransformer."""
    qrels = data.qrels.get(split)
    if qrels is None:
        raise DataError(f"split {split!r} was not loaded")
    if negatives == "none":
        out = [Example(data.queries[q], data.doc_text(d))
               for q, rel in qrels.items() for d, g in rel.items() if g > 0]
    else:
        if negatives == "dense":
            miner = models.load(miner_model, device=device) if isinstance(miner_model, str) else miner_model
            searcher = DenseSearcher(miner, data.doc_ids, data.doc_texts(),
                                     cache=cache, show_progress=show_progress)
        elif negatives == "bm25":
            searcher = BM25Searcher(data.doc_ids, data.doc_texts(), language=language)
        else:
            raise DataError(f"negatives must be 'dense', 'bm25' or 'none', got {negatives!r}")
        window = (min(window[0], len(data.corpus)), min(window[1], len(data.corpus)))
        cfg = MiningConfig(window=window, num_negatives=num_negatives, seed=seed, with_scores=False,
                           drop_empty=False, text_dup_threshold=0.8)
        groups = mine_hard_negatives(data, split, searcher, cfg, show_progress=show_progress)
        out = [Example(g.query, p, list(g.neg)) for g in groups for p in g.pos]
    if not out:
        raise DataError(f"split {split!r} has no (query, positive) pair")
    if max_queries is not None and len(out) > max_queries:
        out = random.Random(seed).sample(out, max_queries)
    return out


def remine_negatives(examples: Sequence[Example], data, split: str, model, *, window: tuple[int, int],
                     num_negatives: int, seed: int, show_progress: bool = False) -> list[list[str]]:
    """ANCE-style self-mining: each example's hard negatives mined again, in ranks ``window`` of
    ``model``'s own dense side (a HyReC model being trained; encoded in eval mode, its training flags put
    back, through a throw-away cache), in the order of ``examples``."""
    was = {m: m.training for m in model.st.modules()}
    model.st.eval()
    try:
        with tempfile.TemporaryDirectory(prefix="medadapt-self-mining-") as tmp:
            fresh = build_examples(data, split, negatives="dense", window=window, num_negatives=num_negatives,
                                   miner_model=model.st, cache=EmbeddingCache(tmp), seed=seed,
                                   show_progress=show_progress)
    finally:
        for m, flag in was.items():
            m.train(flag)
    mined = {(e.query, e.positive): e.negatives for e in fresh}
    return [list(mined[(e.query, e.positive)]) for e in examples]


def load_pairs(path: str | Path, split: str = "train") -> list[tuple[str, str]]:
    """(query, positive) pairs of the preliminary fine-tuning: every positive of a FlagEmbedding JSONL file
    (``{"query": ..., "pos": [...]}``, :func:`medadapt.data.training.load_training_groups`) or every
    positive qrel of ``split`` of a BEIR folder. A missing path or a file with no pair is a
    :class:`~medadapt.errors.DataError`."""
    path = Path(path)
    if path.is_dir():
        data = load_beir(path, [split])
        pairs = [(data.queries[q], data.doc_text(d)) for q, rel in data.qrels[split].items()
                 for d, g in rel.items() if g > 0]
    elif path.is_file():
        pairs = [(g.query, p) for g in load_training_groups(path) for p in g.pos]
    else:
        raise DataError(f"pairs not found: {path} (a JSONL file of {{query, pos}} groups or a BEIR folder)")
    if not pairs:
        raise DataError(f"{path}: no (query, positive) pair")
    return pairs


def score_pairs(scorer, pairs: Sequence[tuple[str, str]], *, cache=None, batch_size: int = 64,
                show_progress: bool = False) -> list[float]:
    """Cosine of each (query, passage) pair under ``scorer`` (a SentenceTransformer): queries through
    ``encode_query``, passages through ``encode_document``, unit-normalised; with ``cache`` (an
    :class:`~medadapt.cache.EmbeddingCache`) only uncached texts are encoded."""
    import numpy as np

    queries, docs = [q for q, _ in pairs], [p for _, p in pairs]
    if cache is not None:
        qv = cache.encode(scorer, queries, role="query", batch_size=batch_size, show_progress=show_progress)
        pv = cache.encode(scorer, docs, role="document", batch_size=batch_size, show_progress=show_progress)
    else:
        qv = scorer.encode_query(queries, batch_size=batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=show_progress)
        pv = scorer.encode_document(docs, batch_size=batch_size, normalize_embeddings=True,
                                    convert_to_numpy=True, show_progress_bar=show_progress)
    return np.einsum("ij,ij->i", np.asarray(qv, dtype=np.float32), np.asarray(pv, dtype=np.float32)).tolist()


def filter_pairs(pairs: Sequence[tuple[str, str]], scores: Sequence[float] | None, min_score: float, *,
                 max_pairs: int | None = None, seed: int = 42) -> list[Example]:
    """The pairs scoring ``>= min_score`` (all of them when ``scores`` is ``None``), as :class:`Example` s
    without hard negatives, sampled down to ``max_pairs``; none left is a :class:`DataError`."""
    kept = [Example(q, p) for i, (q, p) in enumerate(pairs) if scores is None or scores[i] >= min_score]
    if not kept:
        best = max(scores) if scores else float("nan")
        raise DataError(f"no pair scores >= {min_score} (best {best:.4f} of {len(pairs)}); lower min_score")
    if max_pairs is not None and len(kept) > max_pairs:
        kept = random.Random(seed).sample(kept, max_pairs)
    return kept


def _hash(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


class CachedDenseInputs:
    """The frozen dense encoder's pooled inputs for the training texts, read from the
    :class:`~medadapt.cache.EmbeddingCache` once per role and then served from memory: a training step
    looks its rows up instead of asking the cache (which fingerprints the backbone and lists its shards on
    every call). ``fill()`` reads both roles now (e.g. inside ``main_process_first``); otherwise a role is
    read on first use. Texts outside the declared ones go to the cache."""

    def __init__(self, cache, view, queries: Sequence[str], documents: Sequence[str]):
        self.cache, self.view = cache, view
        self._texts = {"query": list(dict.fromkeys(queries)), "document": list(dict.fromkeys(documents))}
        self._tables: dict[str, tuple[dict[str, int], Tensor]] = {}

    def fill(self, show_progress: bool = False) -> CachedDenseInputs:
        for role in self._texts:
            self._table(role, show_progress)
        return self

    def _table(self, role: str, show_progress: bool = False) -> tuple[dict[str, int], Tensor]:
        if role not in self._tables:
            texts = self._texts[role]
            emb = self.cache.encode(self.view, texts, role=role, show_progress=show_progress)
            self._tables[role] = ({t: i for i, t in enumerate(texts)}, torch.from_numpy(emb))
        return self._tables[role]

    def __call__(self, texts: Sequence[str], role: str) -> Tensor:
        index, emb = self._table(role)
        texts = list(texts)
        if all(t in index for t in texts):
            return emb[[index[t] for t in texts]]
        return torch.from_numpy(self.cache.encode(self.view, texts, role=role, show_progress=False))


#: Shard format of :class:`SharedStateCache` (2: a ``sha256`` of the tensors in the metadata). It is part of the
#: namespace, so shards of an earlier format are never read.
STATE_FORMAT = 2


def _state_digest(state: dict[str, Tensor]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        t = state[key]
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _read_shard(path: Path) -> dict[str, Tensor]:
    """A shard's tensors after its checksum and finiteness are checked (:class:`ValueError` otherwise)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"unreadable ({(str(exc).strip().splitlines() or [type(exc).__name__])[0]})") from None
    if meta.get("sha256") is None:
        raise ValueError("no checksum")
    if _state_digest(state) != meta["sha256"]:
        raise ValueError("checksum differs (truncated or bit-flipped)")
    if not all(bool(torch.isfinite(v).all()) for k, v in state.items() if k.endswith(".h")):
        raise ValueError("non-finite states")
    return state


class SharedStateCache:
    """Per-text token states of a frozen sharing backbone.

    Args:
        cache: the :class:`~medadapt.cache.EmbeddingCache` (or its root folder) whose token-states namespace
            holds the shards (``None``: memory only).
        chunk_size: texts encoded (and written as one shard) at a time.
        batch_size: encoding batch size.
    """

    def __init__(self, cache: EmbeddingCache | str | Path | None = None, chunk_size: int = 512,
                 batch_size: int = 32):
        self.cache = EmbeddingCache(cache) if isinstance(cache, (str, Path)) else cache
        self._keys: dict[str, dict] = {}  # namespace -> its EmbeddingCache key
        self.chunk_size = chunk_size
        self.batch_size = batch_size
        self._mem: dict[str, dict[str, tuple[Tensor, Tensor]]] = {}
        self._loaded: set[str] = set()
        self._pooled_mem: dict[str, dict[str, Tensor]] = {}
        # per model object (weak keys: a collected model's entry goes with it, so a new model that reuses
        # its memory address can never inherit its fingerprints); each entry is re-validated against the
        # parameters' version counters (:func:`_versions`), so weights changed in place after it was made (an
        # optimizer step on a trained lexicon encoder, ``load_state_dict``) give a new fingerprint
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._pinned: dict[int, set] = {}  # id(model) -> memo keys already checked inside :meth:`pinned`

    def _model_memo(self, model) -> dict:
        return self._memo.setdefault(model, {})

    @contextlib.contextmanager
    def pinned(self, model):
        """Within the block ``model``'s weights do not change (one encoding pass), so each memoised namespace
        and fingerprint is checked against the weights once, not on every batch (each check takes a norm of
        every shared weight: most of the time of scoring a corpus in batches of 32)."""
        outer = id(model) not in self._pinned
        self._pinned.setdefault(id(model), set())
        try:
            yield
        finally:
            if outer:
                self._pinned.pop(id(model), None)

    def _memoised(self, model, key, modules: list, compute):
        """``compute()`` memoised per model object while the parameters of ``modules`` are unchanged.

        Hashing the weights on every batch would cost more than the cached states save, and the object's
        identity alone is not their content: torch's per-tensor version counter (bumped by every in-place
        write, which is how optimizers and ``load_state_dict`` change weights) tells the two apart cheaply."""
        memo = self._model_memo(model)
        checked = self._pinned.get(id(model))
        if checked is not None and key in checked and key in memo:
            return memo[key][1]
        versions = _versions(modules)
        hit = memo.get(key)
        if versions is None:
            return compute()
        if hit is None or hit[0] != versions:
            hit = memo[key] = (versions, compute())
        if checked is not None:
            checked.add(key)
        return hit[1]

    @staticmethod
    def default_root() -> Path:
        """The default EmbeddingCache root (token states are one of its namespaces)."""
        return default_cache_dir()

    def namespace(self, model, role: str) -> str:
        """Cache namespace of ``model``'s frozen sharing backbone for ``role`` (memoised per model object while
        its weights are unchanged, :meth:`_memoised`)."""
        def compute() -> str:
            max_len = model.config.query_max_length if role == "query" else model.config.passage_max_length
            key = {"model": model.shared_fingerprint(), "max_seq_length": max_len, "states": "hyrec-shared",
                   "state_format": STATE_FORMAT}
            ns = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
            self._keys[ns] = key
            return ns

        return self._memoised(model, ("namespace", role), [model.auto_model.embeddings, *model.shared_layers],
                              compute)

    def _fingerprint(self, model, kind: str) -> str:
        """Fingerprint of the part ``kind`` (``lexicon`` / ``pooled``) of ``model``, memoised per object while
        its weights are unchanged (:meth:`_memoised`)."""
        parts = list(model.lexicon) if kind == "lexicon" else list(model.dense_layers)
        return self._memoised(model, ("fp", kind), parts,
                              lambda: f"{modules_fingerprint(parts)}|{model.config.pooling}")

    def _load_disk(self, ns: str) -> None:
        """Read the namespace's shards into memory. A shard that does not read back intact (unreadable,
        checksum differs, non-finite states, no checksum) is moved aside as ``corrupt-<name>`` with one
        warning; its texts are computed again on demand."""
        if ns in self._loaded or self.cache is None:
            return
        mem = self._mem.setdefault(ns, {})
        for shard in sorted(self.cache.token_states_folder(self._keys[ns]).glob("shard-*.safetensors")):
            try:
                state = _read_shard(shard)
            except ValueError as exc:
                warn(f"HyReC state cache: {shard.name}: {exc}; set aside, its texts are encoded again")
                with contextlib.suppress(OSError):
                    shard.replace(shard.with_name(f"corrupt-{shard.name}"))
                continue
            for k, v in state.items():
                h, kind = k.split(".")
                if kind == "ids":
                    mem[h] = (v, state[f"{h}.h"])
        self._loaded.add(ns)

    @torch.no_grad()
    def ensure(self, model, texts: Sequence[str], role: str, show_progress: bool = False) -> None:
        """Compute (and store) the states of every text not cached yet."""
        ns = self.namespace(model, role)
        self._load_disk(ns)
        mem = self._mem.setdefault(ns, {})
        missing = list(dict.fromkeys(t for t in texts if _hash(t) not in mem))
        if not missing:
            return
        missing.sort(key=len, reverse=True)
        was = model.training
        model.eval()
        what = "queries" if role == "query" else "documents"
        bar = progress(total=len(missing), desc=f"shared states ({what})", unit="text", disable=not show_progress)
        try:
            for c in range(0, len(missing), self.chunk_size):
                chunk = missing[c : c + self.chunk_size]
                new: dict[str, tuple[Tensor, Tensor]] = {}
                for b in range(0, len(chunk), self.batch_size):
                    batch = chunk[b : b + self.batch_size]
                    feats = {k: v.to(model.device) for k, v in model.tokenize(batch, role).items()}
                    states = model.shared_states(feats["input_ids"], feats["attention_mask"],
                                                 feats.get("token_type_ids"))
                    half = states.to(torch.float16)
                    if not bool(torch.isfinite(half).all()):  # NaN, or beyond float16's range
                        raise MedAdaptError("HyReC state cache: the sharing backbone's token states are not "
                                            "finite in float16; nothing was cached")
                    for i, t in enumerate(batch):
                        n = int(feats["attention_mask"][i].sum())
                        new[_hash(t)] = (feats["input_ids"][i, :n].to(torch.int32).cpu(), half[i, :n].cpu())
                    bar.update(len(batch))
                mem.update(new)
                if self.cache is not None:
                    self._write(ns, new)
        finally:
            bar.close()
            model.train(was)

    def _write(self, ns: str, new: dict[str, tuple[Tensor, Tensor]]) -> None:
        """One shard, with the SHA-256 of its tensors in its metadata, written atomically (fsynced)."""
        from safetensors.torch import save

        state = {}
        for h, (ids, st) in new.items():
            state[f"{h}.ids"], state[f"{h}.h"] = ids.contiguous(), st.contiguous()
        data = save(state, metadata={"format": str(STATE_FORMAT), "sha256": _state_digest(state)})
        folder = self.cache.token_states_folder(self._keys[ns])
        with atomic_open(folder / f"shard-{uuid.uuid4().hex}.safetensors", "wb") as f:
            f.write(data)

    def batch(self, model, texts: Sequence[str], role: str) -> tuple[Tensor, Tensor, Tensor]:
        """Padded ``(input_ids, attention_mask, states float32)`` for ``texts`` (computed if missing)."""
        self.ensure(model, texts, role)
        mem = self._mem[self.namespace(model, role)]
        items = [mem[_hash(t)] for t in texts]
        ids, mask = self._pad_ids(model, [i for i, _ in items])
        states = pad_sequence([s for _, s in items], batch_first=True).float()
        return ids, mask, states

    @staticmethod
    def _pad_ids(model, id_rows: list[Tensor]) -> tuple[Tensor, Tensor]:
        pad = model.tokenizer.pad_token_id or 0
        ids = pad_sequence([i.long() for i in id_rows], batch_first=True, padding_value=pad)
        mask = pad_sequence([torch.ones(len(i), dtype=torch.long) for i in id_rows], batch_first=True)
        return ids, mask

    def _derived(self, model, texts: Sequence[str], role: str, kind: str, show_progress: bool = False
                 ) -> dict[str, Tensor]:
        """Memoised (in memory) outputs of a frozen part on top of the shared states: ``kind`` is
        ``"lexicon"`` (lexicon-encoder token states, float32) or ``"pooled"`` (pooled dense-encoder output).
        Missing texts are computed in eval mode (no dropout), longest first, with a progress bar."""
        prefix = f"{self.namespace(model, role)}|{kind}|"
        key = prefix + self._fingerprint(model, kind)
        if key not in self._pooled_mem:  # the part changed (e.g. a trained lexicon encoder): drop stale states
            for old in [k for k in self._pooled_mem if k.startswith(prefix)]:
                del self._pooled_mem[old]
        mem = self._pooled_mem.setdefault(key, {})
        missing = list(dict.fromkeys(t for t in texts if _hash(t) not in mem))
        if not missing:
            return mem
        if kind == "pooled" and self._same_frozen_encoders(model):
            # the dense and lexicon encoders are identical frozen copies: pool the cached lexicon states
            lex = self._derived(model, missing, role, "lexicon", show_progress)
            for t in missing:
                x = lex[_hash(t)]
                mem[_hash(t)] = x[0].clone() if model.config.pooling == "cls" else x.mean(0)
            return mem
        self.ensure(model, missing, role, show_progress=show_progress)
        states = self._mem[self.namespace(model, role)]  # one fingerprint, not one per text
        missing.sort(key=lambda t: len(states[_hash(t)][0]), reverse=True)
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                for b in progress(range(0, len(missing), self.batch_size), desc=f"{kind} states", unit="batch",
                              disable=not show_progress):
                    batch = missing[b : b + self.batch_size]
                    ids, mask, states = self.batch(model, batch, role)
                    states, dmask = states.to(model.device), mask.to(model.device)
                    if kind == "lexicon":
                        out = model.lexicon_states(states, dmask).float().cpu()
                        for r, t in enumerate(batch):
                            mem[_hash(t)] = out[r, : int(mask[r].sum())]
                    else:
                        out = model.pooled_from_states(states, dmask).float().cpu()
                        for t, v in zip(batch, out):
                            mem[_hash(t)] = v
        finally:
            model.train(was)
        return mem

    def _same_frozen_encoders(self, model) -> bool:
        return self._fingerprint(model, "lexicon") == self._fingerprint(model, "pooled")

    def warm(self, model, texts: Sequence[str], role: str, *, lexicon: bool = False, pooled: bool = False,
             show_progress: bool = False) -> None:
        """Compute the shared states (and optionally lexicon states / pooled dense inputs) of ``texts`` now,
        in length-sorted batches, instead of on demand during training."""
        self.ensure(model, texts, role, show_progress=show_progress)
        if lexicon:
            self._derived(model, texts, role, "lexicon", show_progress)
        if pooled:
            self._derived(model, texts, role, "pooled", show_progress)

    def lexicon_batch(self, model, texts: Sequence[str], role: str) -> tuple[Tensor, Tensor, Tensor]:
        """Like :meth:`batch` but with the (frozen) lexicon encoder's output: with a frozen lexicon encoder
        only the projectors need gradients."""
        mem = self._derived(model, texts, role, "lexicon")
        shared = self._mem[self.namespace(model, role)]
        ids, mask = self._pad_ids(model, [shared[_hash(t)][0] for t in texts])
        states = pad_sequence([mem[_hash(t)] for t in texts], batch_first=True)
        return ids, mask, states

    def pooled(self, model, texts: Sequence[str], role: str) -> Tensor:
        """Pooled outputs of the (frozen) dense encoder for ``texts`` (before the projector)."""
        mem = self._derived(model, texts, role, "pooled")
        return torch.stack([mem[_hash(t)] for t in texts])


class UnionLabelCache:
    """Memoised BMES labels per (text, role), padded to a batch's token length."""

    def __init__(self, model, language: str):
        self.model = model
        self.labeler = UnionLabeler(model.tokenizer, language)  # type: ignore[arg-type]
        self._mem: dict[tuple[str, str], list[int]] = {}

    def labels(self, texts: Sequence[str], role: str, length: int) -> Tensor:
        out = torch.full((len(texts), length), IGNORE, dtype=torch.long)
        cfg = self.model.config
        max_len = cfg.query_max_length if role == "query" else cfg.passage_max_length
        for r, t in enumerate(texts):
            key = (t, role)
            if key not in self._mem:
                self._mem[key] = self.labeler(t, max_length=max_len)["union_labels"]
            lab = self._mem[key][:length]
            out[r, : len(lab)] = torch.tensor(lab, dtype=torch.long)
        return out
