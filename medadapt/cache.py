"""On-disk embedding cache: encode each text once per model setting, reuse it everywhere.

Why hand-written: sentence-transformers and FAISS have no persistent, text-keyed embedding store, and
training heads on frozen backbones (the medadapt fast path) needs exactly that.

Layout (all files safetensors / JSON, never pickle)::

    <root>/<namespace>/meta.json                 # what the namespace is (model fingerprint, role, ...)
    <root>/<namespace>/shard-<uuid>.safetensors  # {"hashes": uint8[n,16], "embeddings": float[n,d]}

* The **namespace** is a hash of the backbone identity (:func:`medadapt.models.model_fingerprint`), max
  sequence length, role (query / document / plain), effective prompt and storage dtype.
* What is stored is the input of the model's trailing ``Normalize`` module (the pooled embedding), so one
  encode serves both the model's own output (``normalize=True``: rows L2-normalised on read, exactly what
  ``Normalize`` does) and the un-normalised input that medadapt heads take (``normalize=False``). For a
  model without a trailing ``Normalize`` both are the model's output. Each **text** is keyed by a 128-bit BLAKE2b hash of its UTF-8 bytes, so any subset or
  re-ordering of a corpus hits the cache.
* Missing texts are encoded in chunks (``chunk_size`` texts, longest first); every finished chunk is
  written as its own shard with temp-file + ``os.replace``. A killed run loses at most the chunk in
  flight, never corrupts the cache, and the next run resumes where it stopped. Token tensors exist only
  for one encode batch at a time, so a 1M-document corpus never needs them all in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from medadapt.io import atomic_open, atomic_write_json

Role = Literal["query", "document", "plain"]
CACHE_FORMAT = 1


def default_cache_dir() -> Path:
    """``$MEDADAPT_CACHE`` or ``~/.cache/medadapt/embeddings``."""
    env = os.environ.get("MEDADAPT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "medadapt" / "embeddings"


def text_hash(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def effective_prompt(model, role: Role, prompt: str | None = None, prompt_name: str | None = None) -> str:
    """The prompt string sentence-transformers would prepend for this role (mirrors ``encode_query`` /
    ``encode_document`` / ``encode`` defaults)."""
    if prompt is not None:
        return prompt
    prompts = getattr(model, "prompts", None) or {}
    if prompt_name is not None:
        return prompts[prompt_name]
    if role == "query" and "query" in prompts:
        return prompts["query"]
    if role == "document":
        for name in ("document", "passage", "corpus"):
            if name in prompts:
                return prompts[name]
    default = getattr(model, "default_prompt_name", None)
    if role == "plain" and default:
        return prompts.get(default, "")
    return ""


def ends_with_normalize(model) -> bool:
    from sentence_transformers.base.modules import Normalize

    modules = list(getattr(model, "_modules", {}).values())
    return bool(modules) and isinstance(modules[-1], Normalize)


def without_normalize(model):
    """A view of ``model`` with its trailing ``Normalize`` module(s) removed (shares the other modules).

    Heads sit before ``Normalize``, so the fast training path caches these un-normalised embeddings.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize

    modules = list(model._modules.values())
    while modules and isinstance(modules[-1], Normalize):
        modules.pop()
    view = SentenceTransformer(modules=modules, device=str(model.device), prompts=dict(model.prompts or {}))
    view.default_prompt_name = model.default_prompt_name
    return view


class EmbeddingCache:
    """Text-keyed, sharded, crash-safe embedding cache.

    Example::

        cache = EmbeddingCache()                       # ~/.cache/medadapt/embeddings
        docs = cache.encode(model, texts, role="document")
        queries = cache.encode(model, questions, role="query")

    Args:
        root: cache folder (default :func:`default_cache_dir`).
        chunk_size: texts encoded between two shard writes.
        dtype: storage dtype, ``"float32"`` or ``"float16"``; results are always returned as float32.
    """

    def __init__(self, root: str | Path | None = None, chunk_size: int = 1024, dtype: str = "float32"):
        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.chunk_size = chunk_size
        self.dtype = dtype
        self._fingerprints: dict[int, str] = {}

    # ------------------------------------------------------------------ keys
    def fingerprint(self, model) -> str:
        from medadapt.models import model_fingerprint

        key = id(model)
        if key not in self._fingerprints:
            self._fingerprints[key] = model_fingerprint(model)
        return self._fingerprints[key]

    def namespace(self, model, role: Role, prompt: str) -> tuple[str, dict]:
        meta = {
            "format": CACHE_FORMAT,
            "model": self.fingerprint(model),
            "max_seq_length": getattr(model, "max_seq_length", None),
            "role": role,
            "prompt": prompt,
            "stored": "pre_normalize",
            "dtype": self.dtype,
        }
        digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
        return digest, meta

    # ------------------------------------------------------------------ io
    @staticmethod
    def _shards(ns_dir: Path) -> list[Path]:
        return sorted(ns_dir.glob("shard-*.safetensors"))

    def _index(self, ns_dir: Path) -> tuple[dict[bytes, tuple[int, int]], list[Path]]:
        from safetensors import safe_open

        index: dict[bytes, tuple[int, int]] = {}
        shards = self._shards(ns_dir)
        for s, shard in enumerate(shards):
            with safe_open(str(shard), framework="numpy") as f:
                hashes = f.get_tensor("hashes")
            for r, h in enumerate(hashes):
                index.setdefault(h.tobytes(), (s, r))
        return index, shards

    def _write_shard(self, ns_dir: Path, hashes: list[bytes], emb: np.ndarray) -> None:
        from safetensors.numpy import save

        payload = save(
            {
                "hashes": np.frombuffer(b"".join(hashes), dtype=np.uint8).reshape(len(hashes), 16),
                "embeddings": np.ascontiguousarray(emb.astype(self.dtype)),
            }
        )
        with atomic_open(ns_dir / f"shard-{uuid.uuid4().hex}.safetensors", "wb") as f:
            f.write(payload)

    # ------------------------------------------------------------------ api
    def encode(
        self,
        model,
        texts: Sequence[str],
        role: Role = "plain",
        *,
        prompt: str | None = None,
        prompt_name: str | None = None,
        normalize: bool = True,
        batch_size: int = 64,
        show_progress: bool = True,
        desc: str | None = None,
    ) -> np.ndarray:
        """Return float32 embeddings (``len(texts) × dim``) for ``texts``, encoding only cache misses.

        Args:
            model: a ``SentenceTransformer``.
            texts: the texts, in the order wanted back.
            role: ``"query"`` uses ``encode_query``, ``"document"`` ``encode_document``, ``"plain"`` ``encode``.
            prompt / prompt_name: as in sentence-transformers; part of the cache key.
            normalize: ``True`` returns what the model's ``encode`` returns; ``False`` returns the embedding
                *before* the model's trailing ``Normalize`` module (the input of medadapt heads).
        """
        if role not in ("query", "document", "plain"):
            raise ValueError(f"role must be 'query', 'document' or 'plain', got {role!r}")
        texts = list(texts)
        if not texts:
            return np.zeros((0, model.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        eff_prompt = effective_prompt(model, role, prompt, prompt_name)
        ns, meta = self.namespace(model, role, eff_prompt)
        ns_dir = self.root / ns
        ns_dir.mkdir(parents=True, exist_ok=True)
        if not (ns_dir / "meta.json").exists():
            atomic_write_json(ns_dir / "meta.json", meta)

        hashes = [text_hash(t) for t in texts]
        index, _ = self._index(ns_dir)
        missing: dict[bytes, str] = {}
        for h, t in zip(hashes, texts):
            if h not in index and h not in missing:
                missing[h] = t
        if missing:
            self._encode_missing(model, ns_dir, missing, role, eff_prompt, batch_size, show_progress, desc)
            index, _ = self._index(ns_dir)
        out = self._gather(ns_dir, index, hashes)
        if normalize and ends_with_normalize(model):
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out

    def count_missing(self, model, texts: Sequence[str], role: Role = "plain", *, prompt: str | None = None,
                      prompt_name: str | None = None) -> int:
        """How many distinct ``texts`` are not cached yet for this model and role (nothing is encoded)."""
        ns, _ = self.namespace(model, role, effective_prompt(model, role, prompt, prompt_name))
        ns_dir = self.root / ns
        index = self._index(ns_dir)[0] if ns_dir.is_dir() else {}
        return len({h for h in map(text_hash, texts) if h not in index})

    def _encode_missing(self, model, ns_dir, missing, role, prompt, batch_size, show_progress, desc) -> None:
        from tqdm.auto import tqdm

        encoder = without_normalize(model) if ends_with_normalize(model) else model
        fn = {"query": encoder.encode_query, "document": encoder.encode_document, "plain": encoder.encode}[role]
        items = sorted(missing.items(), key=lambda kv: -len(kv[1]))  # longest first, like ST does per call
        bar = tqdm(total=len(items), desc=desc or f"encoding ({role})", unit="text", disable=not show_progress)
        try:
            for start in range(0, len(items), self.chunk_size):
                chunk = items[start : start + self.chunk_size]
                emb = fn(
                    [t for _, t in chunk],
                    prompt=prompt,
                    batch_size=batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                )
                self._write_shard(ns_dir, [h for h, _ in chunk], np.asarray(emb, dtype=np.float32))
                bar.update(len(chunk))
        finally:
            bar.close()

    @staticmethod
    def _gather(ns_dir: Path, index: dict[bytes, tuple[int, int]], hashes: list[bytes]) -> np.ndarray:
        from safetensors import safe_open

        shards = sorted(ns_dir.glob("shard-*.safetensors"))
        locs = np.array([index[h] for h in hashes], dtype=np.int64)
        out = None
        for s in np.unique(locs[:, 0]):
            with safe_open(str(shards[s]), framework="numpy") as f:
                emb = f.get_tensor("embeddings")
            if out is None:
                out = np.empty((len(hashes), emb.shape[1]), dtype=np.float32)
            sel = np.nonzero(locs[:, 0] == s)[0]
            out[sel] = emb[locs[sel, 1]]
        return out

    def clear(self) -> None:
        """Delete every cached embedding under ``root``."""
        import shutil

        if self.root.exists():
            shutil.rmtree(self.root)
