"""On-disk embedding cache: encode each text once per model setting and reuse it everywhere.

sentence-transformers and FAISS have no persistent, text-keyed embedding store, and training heads on frozen
backbones needs one. A namespace per (backbone fingerprint, max length, role, prompt, dtype) holds atomic,
checksummed safetensors shards of *backbone* outputs keyed by a hash of each text; heads and ``Normalize`` run
on read, and a ``Router`` model is cached per route. Shard reading and verification live in
:mod:`medadapt.cache_shards`. Layout, integrity, locking, threads and out-of-core reads: docs/cache.md and
docs/guarantees.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np

from medadapt.cache_shards import (  # noqa: F401 - re-exported: the shard format is part of the cache's API
    CachedEmbeddings,
    ShardIndex,
    ShardLayout,
    _CorruptShard,
    _remember_verified,
    _sha256,
    apply_embedding_modules,
    hash_keys,
    read_embeddings,
    read_hashes,
    read_layout,
    torch_no_grad_lazy,
    verified_layout,
)
from medadapt.errors import DataError, MedAdaptError, MedAdaptWarning
from medadapt.identity import modules_fingerprint
from medadapt.io import atomic_open, atomic_write_json
from medadapt.locks import model_lock, path_lock
from medadapt.progress import progress

Role = Literal["query", "document", "plain"]
CACHE_FORMAT = 1
#: Characters of a text handed to the model per token of ``max_seq_length``. English runs ~4-5 characters
#: per token and even code or URLs stay under ~10, so 32 never cuts text the tokenizer would have kept;
#: :func:`clip_text` widens the budget anyway when the clipped text yields too few tokens.
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


def is_embedding_module(module) -> bool:
    """True for modules that read and write only ``features["sentence_embedding"]``: ``Normalize`` and
    medadapt heads (which declare ``operates_on_sentence_embedding = True``). Such modules can run on cached
    embeddings instead of on token features."""
    from sentence_transformers.base.modules import Normalize

    return isinstance(module, Normalize) or bool(getattr(module, "operates_on_sentence_embedding", False))


def split_backbone(model) -> tuple[list, list]:
    """Split a SentenceTransformer's modules into the *backbone* (everything up to the trailing run of
    embedding-level modules) and the *embedding modules* (heads, ``Normalize``) after it."""
    modules = list(model._modules.values())
    i = len(modules)
    while i > 0 and is_embedding_module(modules[i - 1]):
        i -= 1
    if i == 0:
        raise ValueError("the model has no backbone modules before its embedding-level modules")
    return modules[:i], modules[i:]


def backbone_view(model):
    """A ``SentenceTransformer`` made of ``model``'s backbone modules only (shared, not copied), with the
    same prompts; its ``encode`` returns the pooled embedding that heads and ``Normalize`` take."""
    from sentence_transformers import SentenceTransformer

    backbone, _ = split_backbone(model)
    view = SentenceTransformer(modules=backbone, device=str(model.device), prompts=dict(model.prompts or {}))
    view.default_prompt_name = model.default_prompt_name
    return view


def router_route(model, role: Role) -> str | None:
    """The route of ``model``'s leading ``Router`` that ``encode_query`` (``role="query"``) or
    ``encode_document`` (``role="document"``) runs for text, or ``None`` (other roles, no leading Router, no
    such route, a route without a backbone module)."""
    if role not in ("query", "document"):
        return None
    from sentence_transformers.base.modules import Router

    router = next(iter(model._modules.values()), None)
    if not isinstance(router, Router):
        return None
    try:  # honours the Router's route_mappings, as its forward does
        route = router._resolve_route(task=role, modality="text")
    except Exception:  # noqa: BLE001 - private API or unresolvable: fall back to the plain route name
        route = role
    if route not in router.sub_modules or all(is_embedding_module(m) for m in router.sub_modules[route]):
        return None  # an empty or embedding-level-only route: the whole model stays the cache's unit
    return route


def _route_view_modules(model, route: str) -> list:
    modules = list(model._modules.values())
    return list(modules[0].sub_modules[route]) + modules[1:]


def route_view(model, role: Role):
    """A ``SentenceTransformer`` of the ``role`` route's modules plus the modules after the ``Router``
    (shared, same prompts): it encodes as ``model`` does for ``role`` and has the standalone tower's cache
    namespace. ``None`` when ``model`` has no such route."""
    route = router_route(model, role)
    if route is None:
        return None
    from sentence_transformers import SentenceTransformer

    view = SentenceTransformer(modules=_route_view_modules(model, route), device=str(model.device),
                               prompts=dict(model.prompts or {}))
    view.default_prompt_name = model.default_prompt_name
    return view


def clip_text(encoder, text: str) -> str:
    """``text`` cut to ``max_seq_length * CLIP_CHARS_PER_TOKEN`` characters so the tokenizer never sees a
    whole multi-megabyte document; the budget grows (4x at a time, up to ``_CLIP_MAX_GROWTH``x) while the cut
    yields fewer than ``2 * max_seq_length`` tokens, so the tokens the model keeps do not change."""
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
    """Advisory lock on ``<ns_dir>/.lock``: writers of one namespace take turns (threads first on
    :func:`medadapt.locks.path_lock`, then processes on ``fcntl.flock``, a no-op where unavailable).
    ``shared=True`` is for the processes of one distributed encode, which write disjoint texts."""
    with path_lock(ns_dir / ".lock"):
        with _flock(ns_dir, shared):
            yield


@contextlib.contextmanager
def _flock(ns_dir: Path, shared: bool) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows
        yield
        return
    try:
        fd = os.open(ns_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o666)  # umask applies
    except OSError:  # read-only folder: the shard write will report the real problem
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            locked = True
        except OSError:  # e.g. ENOLCK on some network file systems: go on unlocked
            locked = False
        try:
            yield
        finally:
            if locked:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
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
    """The embedding-level modules applied to cached rows; without ``normalize``, minus trailing ``Normalize``."""
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
        self._unusable: set[Path] = set()  # corrupt shards that could not be renamed

    # ------------------------------------------------------------------ keys
    def fingerprint(self, model) -> str:
        """Fingerprint of the model's backbone modules (:func:`split_backbone`), hashed from the weights on
        every call so a model changed in place gets a new namespace; other backends get their own."""
        return modules_fingerprint(split_backbone(model)[0])

    def role_fingerprint(self, model, role: Role) -> str:
        """The fingerprint :meth:`encode` keys ``role`` with (a ``Router`` model's route, else the backbone)."""
        return self.fingerprint(self.encoder_for(model, role))

    @staticmethod
    def encoder_for(model, role: Role):
        """The model the cache encodes and keys ``role`` with: ``model`` itself, or for an asymmetric
        (``Router``) model and role ``"query"`` / ``"document"`` its :func:`route_view` (repeated while the
        route itself starts with a Router). Views share ``model``'s modules and are cheap to build."""
        for _ in range(16):
            view = route_view(model, role)
            if view is None:
                return model
            model = view
        raise ValueError("Router routes nested more than 16 deep")

    def namespace(self, model, role: Role, prompt: str, fingerprint: str | None = None) -> tuple[str, dict]:
        """``(folder name, meta)`` of the namespace for ``model`` (its :meth:`encoder_for` ``role``), role and
        effective prompt; ``fingerprint``: see :meth:`encode`."""
        model = self.encoder_for(model, role)
        meta = {
            "format": CACHE_FORMAT,
            "model": fingerprint or self.fingerprint(model),
            "max_seq_length": getattr(model, "max_seq_length", None),
            "role": role,
            "prompt": prompt,
            "stored": "backbone_output",
            "dtype": self.dtype,
        }
        digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
        return digest, meta

    # ------------------------------------------------------------------ io
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

    def _index(self, ns_dir: Path) -> tuple[dict[bytes, tuple[int, int]], list[Path]]:
        """``({text hash: (shard number, row)}, shards)``: the shard numbers index the returned snapshot of the
        shard files, which :meth:`_gather` must be given (a concurrent writer may add shards meanwhile).
        Shards whose hashes fail their checks are set aside (:meth:`_set_aside`) and left out."""
        index: dict[bytes, tuple[int, int]] = {}
        shards = []
        for shard in self._shards(ns_dir):
            try:
                hashes = read_hashes(shard)
            except FileNotFoundError:  # set aside by another process since the listing
                continue
            except _CorruptShard as e:
                self._set_aside(shard, str(e))
                continue
            s = len(shards)
            shards.append(shard)
            for r, h in enumerate(hashes):
                index.setdefault(h.tobytes(), (s, r))
        return index, shards

    def _write_shard(self, ns_dir: Path, hashes: list[bytes], emb: np.ndarray) -> None:
        """Write one shard atomically, with the SHA-256 of both tensors in its metadata. Non-finite rows
        (also float16 overflow) raise :class:`~medadapt.errors.MedAdaptError` and nothing is written."""
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
        """``(encoder, effective prompt, namespace folder, namespace meta)`` for ``model`` in ``role``: a Router
        model's route view is cached per route (:meth:`encoder_for`)."""
        _check_role(role)
        eff_prompt = effective_prompt(model, role, prompt, prompt_name)
        model = self.encoder_for(model, role)
        ns, meta = self.namespace(model, role, eff_prompt, fingerprint)
        return model, eff_prompt, self.root / ns, meta

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
        fingerprint: str | None = None,
    ) -> np.ndarray:
        """Return float32 embeddings (``len(texts) × dim``) for ``texts``, encoding only cache misses.

        Args:
            model: a ``SentenceTransformer``; for an asymmetric (``Router``) model and role ``"query"`` /
                ``"document"`` the route's tower is cached under its own namespace (see :meth:`encoder_for`).
            texts: the texts, in the order wanted back.
            role: ``"query"`` uses ``encode_query``, ``"document"`` ``encode_document``, ``"plain"`` ``encode``.
            prompt / prompt_name: as in sentence-transformers; part of the cache key.
            normalize: ``True`` returns what the model's ``encode`` returns; ``False`` returns the embedding
                *before* the model's trailing ``Normalize`` module (the input of medadapt heads).
            fingerprint: the backbone fingerprint for this role (:meth:`role_fingerprint`), from a caller that
                encodes many batches with a model it keeps unchanged, so the weights are not hashed on every
                call; ``None`` (default) hashes them now.
        """
        texts = list(texts)
        if not texts:
            _check_role(role)
            return np.zeros((0, model.get_sentence_embedding_dimension() or 0), dtype=np.float32)
        with model_lock(model):  # fingerprinting and encoding tokenise: one thread per model (medadapt.locks)
            return self._encode(model, texts, role, prompt, prompt_name, normalize, batch_size, show_progress,
                                desc, fingerprint)

    def _encode(self, model, texts, role, prompt, prompt_name, normalize, batch_size, show_progress, desc,
                fingerprint) -> np.ndarray:
        model, eff_prompt, ns_dir, meta = self._resolve(model, role, prompt, prompt_name, fingerprint)
        _ensure_namespace(ns_dir, meta)

        hashes = [text_hash(t) for t in texts]
        for _ in range(_MAX_ROUNDS):  # a round ends early when a shard is corrupt (set aside, re-encoded)
            index, shards = self._index(ns_dir)
            missing: dict[bytes, str] = {}
            for h, t in zip(hashes, texts):
                if h not in index and h not in missing:
                    missing[h] = t
            if missing:
                self._encode_missing(model, ns_dir, missing, role, eff_prompt, batch_size, show_progress,
                                     desc)
                index, shards = self._index(ns_dir)
            out = self._gather(shards, index, hashes)
            if out is not None:
                break
        else:
            raise _gave_up(ns_dir)
        return apply_embedding_modules(_embedding_tail(model, normalize), out)

    def count_missing(self, model, texts: Sequence[str], role: Role = "plain", *, prompt: str | None = None,
                      prompt_name: str | None = None) -> int:
        """How many distinct ``texts`` are not cached yet for this model and role (nothing is encoded; a
        ``Router`` model's query / document roles are looked up per route, as :meth:`encode` does)."""
        with model_lock(model):  # the fingerprint tokenises probe texts
            eff_prompt = effective_prompt(model, role, prompt, prompt_name)
            ns, _ = self.namespace(model, role, eff_prompt)  # per route
        ns_dir = self.root / ns
        index = self._index(ns_dir)[0] if ns_dir.is_dir() else {}
        return len({h for h in map(text_hash, texts) if h not in index})

    def _encode_missing(self, model, ns_dir, missing, role, prompt, batch_size, show_progress, desc) -> None:
        """Encode ``missing`` ({hash: text}) under the namespace lock, skipping texts another process wrote
        meanwhile; the lock is never held across a caller's barrier."""
        with namespace_lock(ns_dir):  # one writer per namespace; released before encode() reads
            index, _ = self._index(ns_dir)  # another process may have written some meanwhile
            missing = {h: t for h, t in missing.items() if h not in index}
            if missing:
                self._encode_locked(model, ns_dir, missing, role, prompt, batch_size, show_progress, desc)

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

    def _gather(self, shards: list[Path], index: dict[bytes, tuple[int, int]],
                hashes: list[bytes]) -> np.ndarray | None:
        """Rows of ``hashes`` from ``shards``, the list ``index`` was built from (a fresh listing could number
        shards differently). ``None`` when a hash is missing or a shard is gone or corrupt (set aside)."""
        if any(h not in index for h in hashes):
            return None
        locs = np.array([index[h] for h in hashes], dtype=np.int64)
        out = None
        ok = True
        for s in np.unique(locs[:, 0]):
            try:
                emb = read_embeddings(shards[s])
            except FileNotFoundError:  # set aside by another process since the index was built
                ok = False
                continue
            except _CorruptShard as e:
                self._set_aside(shards[s], str(e))
                ok = False
                continue  # check the other shards too: every corrupt one is set aside in this round
            if out is None:
                out = np.empty((len(hashes), emb.shape[1]), dtype=np.float32)
            elif emb.shape[1] != out.shape[1]:
                self._set_aside(shards[s], f"{emb.shape[1]}-d rows in a {out.shape[1]}-d namespace")
                ok = False
                continue
            sel = np.nonzero(locs[:, 0] == s)[0]
            out[sel] = emb[locs[sel, 1]]
        return out if ok else None

    # ------------------------------------------------------------------ out-of-core api
    def shard_index(self, model, role: Role = "plain", *, prompt: str | None = None,
                    prompt_name: str | None = None, fingerprint: str | None = None) -> ShardIndex:
        """The :class:`ShardIndex` of this model's namespace for ``role`` (every shard verified once per
        process, corrupt ones set aside)."""
        with model_lock(model):  # the fingerprint tokenises probe texts
            eff_prompt = effective_prompt(model, role, prompt, prompt_name)
            ns, _ = self.namespace(model, role, eff_prompt, fingerprint)
        return ShardIndex.build(self, self.root / ns)

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
        """A lazy, memory-mapped :class:`CachedEmbeddings` over the cached rows of ``texts`` (same arguments
        and same rows as :meth:`encode`), without loading the matrix: rows are read from the shard files
        when asked for. Every shard is verified once per process (:func:`verified_layout`).

        Args:
            encode_missing: encode texts that are not cached yet (as :meth:`encode` does, chunk by chunk
                into new shards) instead of refusing them.

        Raises:
            MedAdaptError: some texts are not cached and ``encode_missing`` is false.
        """
        texts = texts if isinstance(texts, list) else list(texts)
        with model_lock(model):  # fingerprinting and encoding tokenise: one thread per model (medadapt.locks)
            model, eff_prompt, ns_dir, meta = self._resolve(model, role, prompt, prompt_name, fingerprint)
            hashes = [text_hash(t) for t in texts]
            keys = hash_keys(hashes)
            for _ in range(_MAX_ROUNDS):
                index = ShardIndex.build(self, ns_dir)
                shard, row = index.lookup(keys)
                missing = np.flatnonzero(shard < 0)
                if not len(missing):
                    break
                if not encode_missing:
                    raise MedAdaptError(
                        f"{len(missing)} of {len(texts)} texts are not in the embedding cache {ns_dir} "
                        f"({self.dtype}, role {role}); encode them first (`medadapt encode`, "
                        "EmbeddingCache.encode) or pass encode_missing=True")
                _ensure_namespace(ns_dir, meta)
                todo = {hashes[i]: texts[i] for i in missing}
                self._encode_missing(model, ns_dir, todo, role, eff_prompt, batch_size, show_progress, desc)
            else:
                raise _gave_up(ns_dir)
        dim = index.dim or model.get_sentence_embedding_dimension() or 0
        return CachedEmbeddings(index.shards, index.layouts, shard, row, _embedding_tail(model, normalize), dim)

    def iter_embeddings(self, model, texts: Sequence[str], role: Role = "plain", *, batch_size: int = 8192,
                        **view_kwargs) -> Iterator[np.ndarray]:
        """Stream the cached embeddings of ``texts`` in order, ``batch_size`` rows (float32) at a time, from
        memory-mapped shards: memory stays at one batch whatever the corpus size. ``view_kwargs`` are those
        of :meth:`view` (``normalize``, ``prompt``, ``encode_missing``, ...)."""
        yield from self.view(model, texts, role, **view_kwargs).iter_batches(batch_size)

    def token_states_folder(self, key: dict) -> Path:
        """The namespace folder of per-token states a frozen encoder part gives (e.g. HyReC's sharing backbone,
        whose token states training reuses), keyed by ``key`` (its weights fingerprint, token limit, ...) like an
        embedding namespace; texts are keyed by their hash, and the shards are the owner's (checksummed) format."""
        meta = {"format": CACHE_FORMAT, "stored": "token_states", **key}
        ns_dir = self.root / hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
        _ensure_namespace(ns_dir, meta)
        return ns_dir

    def clear(self) -> None:
        """Delete every cached embedding under ``root``."""
        import shutil

        if self.root.exists():
            shutil.rmtree(self.root)
