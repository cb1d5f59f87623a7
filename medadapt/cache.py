"""On-disk embedding cache: encode each text once per model setting and reuse it (no library keeps a
persistent, text-keyed embedding store). Namespaces, integrity, locking and out-of-core reads: docs/cache.md;
shard files: :mod:`medadapt.cache_shards`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from medadapt.cache_shards import CachedEmbeddings, ShardIndex, _remember_verified, _sha256, hash_keys
from medadapt.errors import DataError, MedAdaptError, MedAdaptWarning
from medadapt.identity import json_fingerprint, modules_fingerprint
from medadapt.io import atomic_open, atomic_write_json
from medadapt.locks import model_lock, path_lock
from medadapt.progress import progress

Role = Literal["query", "document", "plain"]
CACHE_FORMAT = 1
#: Characters of a text handed to the model per token of ``max_seq_length`` (English runs ~4-5, code and
#: URLs under ~10); :func:`clip_text` widens it when the clipped text yields too few tokens.
CLIP_CHARS_PER_TOKEN = 32
_CLIP_MAX_GROWTH = 64  # the widened budget stops at 64x (2,048 characters per token), then clips regardless
_MAX_ROUNDS = 32  # encode rounds (corrupt shard found -> re-index, re-encode) before giving up


class CacheCorruptionWarning(MedAdaptWarning):
    """A cache shard was unreadable or failed its checks; it was moved aside and its texts re-encoded."""


def default_cache_dir() -> Path:
    """``$MEDADAPT_CACHE`` or ``~/.cache/medadapt/embeddings``."""
    env = os.environ.get("MEDADAPT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "medadapt" / "embeddings"


def text_hash(text: str) -> bytes:
    """The cache key of one text; a text UTF-8 cannot encode (a lone surrogate) is one :class:`DataError`."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise DataError(f"a text to encode holds a lone surrogate (U+{ord(text[exc.start]):04X} at character "
                        f"{exc.start + 1}), which is not valid Unicode text") from None
    return hashlib.blake2b(data, digest_size=16).digest()


def effective_prompt(model, role: Role, prompt: str | None = None, prompt_name: str | None = None) -> str:
    """The prompt string sentence-transformers would prepend for this role (mirrors ``encode_query`` /
    ``encode_document`` / ``encode`` defaults)."""
    if prompt is not None:
        return prompt
    prompts = getattr(model, "prompts", None) or {}
    if prompt_name is not None:
        return prompts[prompt_name]
    for name in {"query": ("query",), "document": ("document", "passage", "corpus")}.get(role, ()):
        if name in prompts:
            return prompts[name]
    default = getattr(model, "default_prompt_name", None)  # ST falls back to it for every role
    return prompts.get(default, "") if default else ""


def is_embedding_module(module) -> bool:
    """``Normalize`` and medadapt heads (``operates_on_sentence_embedding``): modules that run on cached
    embeddings."""
    from sentence_transformers.base.modules import Normalize

    return isinstance(module, Normalize) or bool(getattr(module, "operates_on_sentence_embedding", False))


def split_backbone(model) -> tuple[list, list]:
    """A SentenceTransformer's modules as ``(backbone, trailing embedding-level modules)``."""
    modules = list(model._modules.values())
    i = len(modules)
    while i > 0 and is_embedding_module(modules[i - 1]):
        i -= 1
    if i == 0:
        raise ValueError("the model has no backbone modules before its embedding-level modules")
    return modules[:i], modules[i:]


def _view(model, modules: list):
    """A ``SentenceTransformer`` of ``modules`` (shared, not copied) with ``model``'s prompts."""
    from sentence_transformers import SentenceTransformer

    view = SentenceTransformer(modules=modules, device=str(model.device), prompts=dict(model.prompts or {}))
    view.default_prompt_name = model.default_prompt_name
    return view


def backbone_view(model):
    """``model``'s backbone alone: its ``encode`` returns what heads and ``Normalize`` take."""
    return _view(model, split_backbone(model)[0])


def route_view(model, role: Role):
    """The modules of the route of ``model``'s leading ``Router`` that ``encode_query`` / ``encode_document``
    runs for text, plus those after the Router: encodes as ``model`` does for ``role``, with the standalone
    tower's namespace; ``None`` for role ``plain``, without a leading Router or such a route."""
    from sentence_transformers.base.modules import Router

    modules = list(model._modules.values())
    if role not in ("query", "document") or not modules or not isinstance(modules[0], Router):
        return None
    try:  # honours the Router's route_mappings, as its forward does
        route = modules[0]._resolve_route(task=role, modality="text")
    except Exception:  # noqa: BLE001 - private API or unresolvable: fall back to the plain route name
        route = role
    if route not in modules[0].sub_modules or all(map(is_embedding_module, modules[0].sub_modules[route])):
        return None  # an empty or embedding-level-only route: the whole model stays the cache's unit
    return _view(model, list(modules[0].sub_modules[route]) + modules[1:])


def clip_text(encoder, text: str) -> str:
    """``text`` cut to ``max_seq_length * CLIP_CHARS_PER_TOKEN`` characters (the tokenizer never sees a
    multi-megabyte document), widened 4x at a time while the cut yields fewer than ``2 * max_seq_length``
    tokens, so the tokens the model keeps do not change."""
    try:
        max_len = encoder.max_seq_length
    except Exception:  # noqa: BLE001 - e.g. a first module without one: no clip
        return text
    if not isinstance(max_len, int) or max_len <= 0:
        return text
    budget = max_len * CLIP_CHARS_PER_TOKEN
    if len(text) <= budget:
        return text
    try:
        tokenizer = encoder.tokenizer
    except Exception:  # noqa: BLE001 - a first module without a tokenizer: plain clip
        tokenizer = None
    limit = budget * _CLIP_MAX_GROWTH
    while True:
        clipped = text[:budget]
        if tokenizer is None or budget >= limit:
            return clipped
        try:  # truncation on: counting stops at 2 * max_len tokens and HF logs no length warning
            ids = tokenizer(clipped, add_special_tokens=False, truncation=True, max_length=2 * max_len)
            ids = ids["input_ids"]
        except Exception:  # noqa: BLE001 - not a HF tokenizer: plain clip
            return clipped
        if len(ids) >= 2 * max_len:
            return clipped
        budget *= 4
        if budget >= len(text):
            return text


@contextlib.contextmanager
def namespace_lock(ns_dir: Path, shared: bool = False) -> Iterator[None]:
    """Writers of one namespace take turns: threads on :func:`medadapt.locks.path_lock`, processes on
    ``fcntl.flock`` of ``<ns_dir>/.lock`` (where available); ``shared``: one distributed encode's processes."""
    with path_lock(ns_dir / ".lock"):
        try:
            import fcntl

            fd = os.open(ns_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o666)  # umask applies
        except (ImportError, OSError):  # Windows, or a read-only folder: the shard write reports the problem
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except OSError:  # e.g. ENOLCK on some network file systems: go on unlocked
            os.close(fd)
            fd = None
        try:
            yield
        finally:
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


def _check_role(role: str) -> None:
    if role not in ("query", "document", "plain"):
        raise ValueError(f"role must be 'query', 'document' or 'plain', got {role!r}")


def _ensure_namespace(ns_dir: Path, meta: dict) -> None:
    """Create a namespace folder with its ``meta.json`` (written once, atomically)."""
    ns_dir.mkdir(parents=True, exist_ok=True)
    if not (ns_dir / "meta.json").exists():
        atomic_write_json(ns_dir / "meta.json", meta)


def _embedding_tail(model, normalize: bool) -> list:
    """The modules applied to cached rows; without ``normalize``, minus trailing ``Normalize``."""
    _, tail = split_backbone(model)
    if not normalize:
        from sentence_transformers.base.modules import Normalize

        while tail and isinstance(tail[-1], Normalize):
            tail = tail[:-1]
    return tail


def _gave_up(ns_dir: Path) -> MedAdaptError:
    return MedAdaptError(f"the embedding cache folder {ns_dir} keeps yielding corrupt or vanishing shards "
                         f"({_MAX_ROUNDS} attempts); check the disk, or delete the folder")


class EmbeddingCache:
    """Text-keyed, sharded, crash-safe embedding cache (``cache.encode(model, texts, role="document")``).

    Args:
        root: cache folder (default :func:`default_cache_dir`).
        chunk_size: texts encoded between two shard writes.
        dtype: storage dtype, ``"float32"`` or ``"float16"``; rows are always returned as float32.
    """

    def __init__(self, root: str | Path | None = None, chunk_size: int = 1024, dtype: str = "float32"):
        if dtype not in ("float32", "float16"):
            raise ValueError(f"dtype must be 'float32' or 'float16', got {dtype!r}")
        if chunk_size < 1:
            raise ValueError("chunk_size must be >= 1")
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.chunk_size = chunk_size
        self.dtype = dtype
        self._unusable: set[Path] = set()  # corrupt shards that could not be renamed

    def fingerprint(self, model) -> str:
        """The backbone's fingerprint, hashed on every call (a model changed in place gets a new namespace)."""
        return modules_fingerprint(split_backbone(model)[0])

    def role_fingerprint(self, model, role: Role) -> str:
        """The fingerprint :meth:`encode` keys ``role`` with (a ``Router`` model's route, else the backbone)."""
        return self.fingerprint(self.encoder_for(model, role))

    @staticmethod
    def encoder_for(model, role: Role):
        """The model the cache encodes and keys ``role`` with: ``model``, or a ``Router`` model's
        :func:`route_view` (repeated while the route starts with a Router)."""
        for _ in range(16):
            view = route_view(model, role)
            if view is None:
                return model
            model = view
        raise ValueError("Router routes nested more than 16 deep")

    def namespace(self, model, role: Role, prompt: str, fingerprint: str | None = None) -> tuple[str, dict]:
        """``(folder name, meta)`` of the namespace of ``model`` (its :meth:`encoder_for` ``role``) and prompt."""
        model = self.encoder_for(model, role)
        limit = getattr(model, "max_seq_length", None)  # a static tower has no limit (inf, which JSON lacks)
        meta = {
            "format": CACHE_FORMAT,
            "model": fingerprint or self.fingerprint(model),
            "max_seq_length": None if isinstance(limit, float) and not np.isfinite(limit) else limit,
            "role": role,
            "prompt": prompt,
            "stored": "backbone_output",
            "dtype": self.dtype,
        }
        return json_fingerprint(meta), meta

    def _shards(self, ns_dir: Path) -> list[Path]:
        return [p for p in sorted(ns_dir.glob("shard-*.safetensors")) if p not in self._unusable]

    def _set_aside(self, shard: Path, reason: str) -> None:
        """Move a corrupt shard out of the way (``corrupt-<name>``, same folder) and warn once."""
        target = shard.with_name(f"corrupt-{shard.name}")
        try:
            os.replace(shard, target)
        except FileNotFoundError:  # another process set it aside first (and warned)
            return
        except OSError as e:  # cannot rename (read-only folder): never read it again in this process
            self._unusable.add(shard)
            warnings.warn(f"embedding cache shard {shard} is corrupt ({reason}) and could not be moved aside "
                          f"({e}); its texts are re-encoded", CacheCorruptionWarning, stacklevel=4)
            return
        warnings.warn(f"embedding cache shard {shard} is corrupt ({reason}); moved it to {target.name} and "
                      f"re-encoding its texts", CacheCorruptionWarning, stacklevel=4)

    def _index(self, ns_dir: Path, checked: set | None = None) -> ShardIndex:
        """The :class:`ShardIndex` of ``ns_dir`` with every shard verified on this call (what :meth:`encode`
        reads; ``checked``: the shards the call verified so far); corrupt shards are set aside."""
        return ShardIndex.build(self, ns_dir, set() if checked is None else checked)

    def _write_shard(self, ns_dir: Path, hashes: list[bytes], emb: np.ndarray) -> None:
        """Write one shard atomically with the SHA-256 of both tensors; non-finite rows (float16 overflow
        too) are a :class:`MedAdaptError` and nothing is written."""
        from safetensors.numpy import save

        emb = np.asarray(emb)
        with np.errstate(over="ignore"):  # float16 overflow becomes inf, refused just below
            stored = np.ascontiguousarray(emb.astype(self.dtype))
        if stored.ndim != 2 or len(stored) != len(hashes):
            raise ValueError(f"embeddings {list(stored.shape)} do not match {len(hashes)} hashes")
        finite = np.isfinite(stored).all(axis=1)
        if not finite.all():
            bad = int((~finite).sum())
            overflow = self.dtype == "float16" and bool(np.isfinite(emb.astype(np.float32)).all())
            raise MedAdaptError(
                f"the model produced non-finite embeddings (NaN or inf) for {bad} of {len(hashes)} texts"
                + (" once stored as float16 (values beyond ±65504); use dtype='float32'" if overflow else "")
                + "; nothing was cached for them"
            )
        hash_array = np.frombuffer(b"".join(hashes), dtype=np.uint8).reshape(len(hashes), 16)
        payload = save(
            {"hashes": hash_array, "embeddings": stored},
            metadata={"format": str(CACHE_FORMAT), "sha256_hashes": _sha256(hash_array),
                      "sha256_embeddings": _sha256(stored)},
        )
        target = ns_dir / f"shard-{uuid.uuid4().hex}.safetensors"
        with atomic_open(target, "wb") as f:
            f.write(payload)
        _remember_verified(target)  # written from checked arrays: memory-mapped reads need not hash it again

    def _resolve(self, model, role: Role, prompt: str | None, prompt_name: str | None,
                 fingerprint: str | None) -> tuple:
        """``(encoder, effective prompt, namespace folder, meta)`` for ``model`` in ``role``."""
        _check_role(role)
        eff_prompt = effective_prompt(model, role, prompt, prompt_name)
        model = self.encoder_for(model, role)
        ns, meta = self.namespace(model, role, eff_prompt, fingerprint)
        return model, eff_prompt, self.root / ns, meta

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
        fingerprint: str | None = None,
    ) -> np.ndarray:
        """Return float32 embeddings (``len(texts) × dim``) for ``texts``, encoding only cache misses; the
        shards read are verified on every call.

        Args:
            role: ``"query"`` uses ``encode_query``, ``"document"`` ``encode_document``, ``"plain"`` ``encode``.
            prompt / prompt_name: as in sentence-transformers; part of the cache key.
            normalize: ``False`` returns the embedding before the trailing ``Normalize`` (the heads' input).
            fingerprint: :meth:`role_fingerprint`, from a caller that keeps the model unchanged over many
                calls (the weights are then not hashed each time).
        """
        texts = list(texts)
        if not texts:
            _check_role(role)
            return np.zeros((0, model.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        with model_lock(model):  # fingerprinting and encoding tokenise: one thread per model (medadapt.locks)
            return self._rows(model, texts, role, prompt, prompt_name, normalize, fingerprint, True, batch_size,
                              show_progress, desc, again=True).to_numpy()

    def _rows(self, model, texts: list[str], role, prompt, prompt_name, normalize, fingerprint, encode_missing,
              batch_size, show_progress, desc, again: bool) -> CachedEmbeddings:
        """The rows of ``texts`` (:meth:`encode` / :meth:`view`): texts not cached are encoded with
        ``encode_missing``, else a :class:`MedAdaptError`; shards verified on this call with ``again``."""
        model, eff_prompt, ns_dir, meta = self._resolve(model, role, prompt, prompt_name, fingerprint)
        hashes = [text_hash(t) for t in texts]
        keys = hash_keys(hashes)
        checked: set = set()
        for _ in range(_MAX_ROUNDS):  # a round ends early when a shard is corrupt (set aside, re-encoded)
            index = self._index(ns_dir, checked) if again else ShardIndex.build(self, ns_dir)
            shard, row = index.lookup(keys)
            missing = np.flatnonzero(shard < 0)
            if not len(missing):
                dim = index.dim or model.get_sentence_embedding_dimension() or 0
                return CachedEmbeddings(index.shards, index.layouts, shard, row, _embedding_tail(model, normalize),
                                        dim)
            if not encode_missing:
                raise MedAdaptError(
                    f"{len(missing)} of {len(texts)} texts are not in the embedding cache {ns_dir} "
                    f"({self.dtype}, role {role}); encode them first (`medadapt encode`, "
                    "EmbeddingCache.encode) or pass encode_missing=True")
            _ensure_namespace(ns_dir, meta)
            todo = {hashes[i]: texts[i] for i in missing}
            self._encode_missing(model, ns_dir, todo, role, eff_prompt, batch_size, show_progress, desc)
        raise _gave_up(ns_dir)

    def _namespace_dir(self, model, role: Role, prompt, prompt_name, fingerprint=None) -> Path:
        with model_lock(model):  # the fingerprint tokenises probe texts
            return self._resolve(model, role, prompt, prompt_name, fingerprint)[2]

    def count_missing(self, model, texts: Sequence[str], role: Role = "plain", *, prompt: str | None = None,
                      prompt_name: str | None = None) -> int:
        """How many distinct ``texts`` are not cached yet for this model and role (nothing is encoded)."""
        ns_dir = self._namespace_dir(model, role, prompt, prompt_name)
        keys = hash_keys(list(dict.fromkeys(map(text_hash, texts))))
        return int((self._index(ns_dir).lookup(keys)[0] < 0).sum())

    def _encode_missing(self, model, ns_dir, missing, role, prompt, batch_size, show_progress, desc) -> int:
        """Encode ``missing`` ({hash: text}) under the namespace lock, skipping texts another process wrote
        meanwhile (the lock is never held across a caller's barrier); returns how many were encoded."""
        with namespace_lock(ns_dir):  # one writer per namespace; released before encode() reads
            found = ShardIndex.build(self, ns_dir).lookup(hash_keys(list(missing)))[0] >= 0  # written meanwhile?
            missing = {h: t for (h, t), f in zip(missing.items(), found) if not f}
            if missing:
                self._encode_locked(model, ns_dir, missing, role, prompt, batch_size, show_progress, desc)
        return len(missing)

    def _encode_locked(self, model, ns_dir, missing, role, prompt, batch_size, show_progress, desc) -> None:
        _, tail = split_backbone(model)
        encoder = backbone_view(model) if tail else model
        fn = {"query": encoder.encode_query, "document": encoder.encode_document, "plain": encoder.encode}[role]
        items = sorted(missing.items(), key=lambda kv: -len(kv[1]))  # longest first, like ST does per call
        bar = progress(total=len(items), desc=desc or f"encoding ({role})", unit="text", disable=not show_progress)
        try:
            for start in range(0, len(items), self.chunk_size):
                chunk = items[start : start + self.chunk_size]
                emb = fn(
                    [clip_text(encoder, t) for _, t in chunk],  # the key stays the full text's hash
                    prompt=prompt,
                    batch_size=batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                )
                self._write_shard(ns_dir, [h for h, _ in chunk], np.asarray(emb, dtype=np.float32))
                bar.update(len(chunk))
        finally:
            bar.close()

    def shard_index(self, model, role: Role = "plain", *, prompt: str | None = None,
                    prompt_name: str | None = None, fingerprint: str | None = None) -> ShardIndex:
        """The :class:`ShardIndex` of this model's namespace for ``role`` (shards verified once per process)."""
        return ShardIndex.build(self, self._namespace_dir(model, role, prompt, prompt_name, fingerprint))

    def view(
        self,
        model,
        texts: Sequence[str],
        role: Role = "plain",
        *,
        prompt: str | None = None,
        prompt_name: str | None = None,
        normalize: bool = True,
        fingerprint: str | None = None,
        encode_missing: bool = False,
        batch_size: int = 64,
        show_progress: bool = True,
        desc: str | None = None,
    ) -> CachedEmbeddings:
        """A lazy, memory-mapped :class:`CachedEmbeddings` of ``texts`` (the rows :meth:`encode` returns, read
        from the shards when asked for; each shard verified once per process). Texts not cached are encoded
        with ``encode_missing``, else a :class:`MedAdaptError`."""
        texts = texts if isinstance(texts, list) else list(texts)
        with model_lock(model):  # fingerprinting and encoding tokenise: one thread per model (medadapt.locks)
            return self._rows(model, texts, role, prompt, prompt_name, normalize, fingerprint, encode_missing,
                              batch_size, show_progress, desc, again=False)

    def iter_embeddings(self, model, texts: Sequence[str], role: Role = "plain", *, batch_size: int = 8192,
                        **view_kwargs) -> Iterator[np.ndarray]:
        """The embeddings of ``texts`` in order, ``batch_size`` rows at a time from memory-mapped shards
        (``view_kwargs``: those of :meth:`view`)."""
        yield from self.view(model, texts, role, **view_kwargs).iter_batches(batch_size)

    def token_states_folder(self, key: dict) -> Path:
        """The namespace folder of per-token states of a frozen encoder part (e.g. HyReC's shared backbone),
        keyed by ``key`` (weights fingerprint, token limit, ...); its shards are the owner's format."""
        meta = {"format": CACHE_FORMAT, "stored": "token_states", **key}
        ns_dir = self.root / json_fingerprint(meta)
        _ensure_namespace(ns_dir, meta)
        return ns_dir

    def clear(self) -> None:
        """Delete every cached embedding under ``root``."""
        import shutil

        if self.root.exists():
            shutil.rmtree(self.root)
