"""The read side of the embedding cache's shard files (safetensors ``hashes`` and ``embeddings`` with the
SHA-256 of each in the metadata): checked reads (:func:`read_hashes`, :func:`read_embeddings`), verification
once per process (:func:`verified_layout`) and memory-mapped rows (:class:`ShardIndex`,
:class:`CachedEmbeddings`). Anything malformed is a :class:`_CorruptShard`, set aside by the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap as mmap_module
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class _CorruptShard(Exception):
    """Internal: why a shard cannot be used."""


def _sha256(array: np.ndarray) -> str:
    return hashlib.sha256(memoryview(np.ascontiguousarray(array)).cast("B")).hexdigest()


def read_hashes(path: Path) -> np.ndarray:
    """A shard's verified ``hashes`` (uint8[n, 16]), checked on every call."""
    return _read_checked(path, "hashes")


def read_embeddings(path: Path) -> np.ndarray:
    """A shard's verified ``embeddings`` (float32 or float16 [n, d], all finite), checked on every call."""
    return _read_checked(path, "embeddings")


def apply_embedding_modules(modules: list, emb: np.ndarray, batch_size: int = 8192) -> np.ndarray:
    """Run embedding-level modules (heads, ``Normalize``) in eval mode over cached embeddings."""
    if not modules or len(emb) == 0:
        return emb
    import torch

    device = next((p.device for m in modules for p in m.parameters()), torch.device("cpu"))
    states = [m.training for m in modules]
    for m in modules:
        m.eval()
    out = []
    try:
        with torch.no_grad():
            for start in range(0, len(emb), batch_size):
                features = {"sentence_embedding": torch.from_numpy(emb[start : start + batch_size]).to(device)}
                for m in modules:
                    features = m(features)
                out.append(features["sentence_embedding"].float().cpu().numpy())
        return np.concatenate(out).astype(np.float32, copy=False)
    finally:
        for m, state in zip(modules, states):
            m.train(state)


# ------------------------------------------------------------------ out-of-core reads
#: safetensors dtype codes of the tensors a shard may hold (little-endian, as the format prescribes).
_ST_DTYPES = {"U8": np.dtype("u1"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}
_HEADER_MAX = 100 * 1024 * 1024  # safetensors' own limit on the JSON header
_VERIFY_CHUNK = 8 * 1024 * 1024  # bytes hashed at a time when verifying a shard by streaming it
_OPEN_MAPS = 64  # memory maps a view keeps open at once (each holds a file descriptor)


@dataclass(frozen=True)
class ShardLayout:
    """Where a shard's tensors lie: ``tensors[name] = (dtype, shape, start, stop)`` (byte offsets in the file)
    and the safetensors metadata (``{}`` for a shard from before checksums)."""

    tensors: dict
    meta: dict

    @property
    def dim(self) -> int:
        return self.tensors["embeddings"][1][1]

    @property
    def dtype(self) -> np.dtype:
        return self.tensors["embeddings"][0]

    def memmap(self, path: Path, name: str = "embeddings") -> np.ndarray:
        """Tensor ``name`` of the shard at ``path`` as a read-only ``numpy.memmap`` (no copy)."""
        dtype, shape, start, _ = self.tensors[name]
        if shape[0] == 0:
            return np.zeros(shape, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=shape)


def _release_pages(arr: np.ndarray) -> None:
    """Drop a memory-mapped shard's pages from this process's resident set once its rows are copied out
    (``MADV_DONTNEED``; they stay in the page cache), so streaming a cache does not inflate RSS."""
    mm = getattr(arr, "_mmap", None)  # numpy.memmap keeps its mmap.mmap here
    advice = getattr(mmap_module, "MADV_DONTNEED", None)
    if mm is not None and advice is not None:
        with contextlib.suppress(OSError, ValueError):
            mm.madvise(advice)


#: Shards verified by this process: (path, device, inode, size, mtime_ns, ctime_ns) -> their layout.
_VERIFIED: dict[tuple, ShardLayout] = {}
_VERIFIED_LOCK = threading.Lock()


def _file_key(path: Path) -> tuple:
    st = os.stat(path)  # FileNotFoundError passes through
    return (os.path.abspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def read_layout(path: Path) -> ShardLayout:
    """Parse and check a shard's safetensors header: ``hashes`` (uint8[n, 16]) and ``embeddings`` (float32
    or float16 [n, d]) inside the file. By hand: safetensors' API copies tensors, ``numpy.memmap`` needs the
    byte offsets only the header gives."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise _CorruptShard("unreadable: shorter than a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > min(_HEADER_MAX, size - 8):
            raise _CorruptShard(f"unreadable: header of {n} bytes in a {size}-byte file")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:  # also invalid UTF-8
            raise _CorruptShard(f"unreadable: header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise _CorruptShard("unreadable: header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if "hashes" not in header or "embeddings" not in header:
        raise _CorruptShard(f"tensors {sorted(header)}, expected 'hashes' and 'embeddings'")
    tensors = {}
    for name in ("hashes", "embeddings"):
        info = header[name]
        try:
            dtype = _ST_DTYPES.get(info["dtype"])
            shape = tuple(int(x) for x in info["shape"])
            start, stop = (int(x) for x in info["data_offsets"])
        except (TypeError, KeyError, ValueError) as e:
            raise _CorruptShard(f"unreadable: bad header entry for {name!r}") from e
        if dtype is None or len(shape) != 2 or min(shape) < 0 or (name == "hashes") != (dtype == np.uint8) \
                or (name == "hashes" and shape[1] != 16):
            raise _CorruptShard(f"{name} are {info['dtype']}{list(shape)}, expected "
                                + ("uint8[n, 16]" if name == "hashes" else "float32 or float16 [n, d]"))
        if stop - start != shape[0] * shape[1] * dtype.itemsize or start < 0 or 8 + n + stop > size:
            raise _CorruptShard(f"unreadable: {name} do not fit the file (truncated?)")
        tensors[name] = (dtype, shape, 8 + n + start, 8 + n + stop)
    if tensors["embeddings"][1][0] != tensors["hashes"][1][0]:
        raise _CorruptShard(f"embeddings are {list(tensors['embeddings'][1])} for {tensors['hashes'][1][0]} hashes")
    return ShardLayout(tensors, dict(meta))


def _stream_check(f, layout: ShardLayout, name: str, keep: bool = False) -> np.ndarray | None:
    """SHA-256 (when recorded) and, for embeddings, finiteness of tensor ``name``, in ``_VERIFY_CHUNK`` pieces;
    with ``keep`` the tensor is returned."""
    dtype, shape, start, stop = layout.tensors[name]
    kept = []
    digest = hashlib.sha256()
    step = max(dtype.itemsize, _VERIFY_CHUNK - _VERIFY_CHUNK % dtype.itemsize)
    f.seek(start)
    left = stop - start
    while left:
        buf = f.read(min(step, left))
        if not buf or len(buf) % dtype.itemsize:
            raise _CorruptShard(f"unreadable: {name} cut short (truncated?)")
        digest.update(buf)
        if keep:
            kept.append(buf)
        if name == "embeddings" and not np.isfinite(np.frombuffer(buf, dtype=dtype)).all():
            raise _CorruptShard("embeddings hold NaN or inf")
        left -= len(buf)
    if layout.meta:  # a shard from before checksums: finiteness, dtype and shape are all that can be checked
        want = layout.meta.get(f"sha256_{name}")
        if want is None:
            raise _CorruptShard(f"metadata without 'sha256_{name}'")
        if digest.hexdigest() != want:
            raise _CorruptShard(f"{name} fail their SHA-256 checksum")
    return np.frombuffer(b"".join(kept), dtype=dtype).reshape(shape) if keep else None


def _read_checked(path: Path, name: str, layout: ShardLayout | None = None, keep: bool = True) -> np.ndarray | None:
    """Tensor ``name`` of a shard, its header, checksum and finiteness checked (``FileNotFoundError`` passes)."""
    layout = layout or read_layout(path)
    try:
        with open(path, "rb") as f:
            return _stream_check(f, layout, name, keep)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise _CorruptShard(f"unreadable: {type(e).__name__}: {e}") from e


def verified_layout(path: Path, checked: set | None = None) -> ShardLayout:
    """The layout of a shard that passed its checks, verified once per process: remembered under the file's
    (path, device, inode, size, mtime, ctime), shards this process wrote counting as verified; with
    ``checked`` (the keys verified so far by one call, which grows) once per call instead (docs/cache.md)."""
    key = _file_key(path)
    with _VERIFIED_LOCK:
        hit = _VERIFIED.get(key)
    if hit is not None and (checked is None or key in checked):
        return hit
    layout = read_layout(path)
    for name in ("hashes", "embeddings"):
        _read_checked(path, name, layout, keep=False)
    if _file_key(path) == key:  # unchanged while it was read
        with _VERIFIED_LOCK:
            _VERIFIED[key] = layout
        if checked is not None:
            checked.add(key)
    return layout


def _remember_verified(path: Path) -> None:
    """Record a shard this process has just written from checked arrays as verified."""
    try:
        layout = read_layout(path)
        key = _file_key(path)
    except (OSError, _CorruptShard):  # e.g. set aside meanwhile: it will be verified when read
        return
    with _VERIFIED_LOCK:
        _VERIFIED[key] = layout


def hash_keys(hashes: Sequence[bytes]) -> np.ndarray:
    """Text hashes (16 bytes each) as a ``numpy`` ``S16`` array: fixed-width, compared byte by byte."""
    return np.frombuffer(b"".join(hashes), dtype="S16") if hashes else np.zeros(0, dtype="S16")


class ShardIndex:
    """Where each cached text hash lies: the verified hashes of a namespace's shards in one sorted ``S16``
    array with (shard, row) per entry, ~24 bytes per text (a dict takes ~200). A hash stored twice resolves
    to its first shard in listing order. ``shards`` / ``layouts``: the snapshot it numbers."""

    def __init__(self, shards: list[Path], layouts: list[ShardLayout], keys: np.ndarray, shard: np.ndarray,
                 row: np.ndarray):
        self.shards, self.layouts = shards, layouts
        self._keys, self._shard, self._row = keys, shard, row
        self.dim = layouts[0].dim if layouts else None
        self.dtype = layouts[0].dtype if layouts else None

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def build(cls, cache: Any, ns_dir: Path, checked: set | None = None) -> ShardIndex:
        """Index the shards of ``ns_dir`` of ``cache`` (an ``EmbeddingCache``), each verified as
        :func:`verified_layout` says; one that fails, or whose width or dtype differs from the namespace's, is
        set aside like any corrupt shard."""
        shards, layouts, parts = [], [], []
        listed = cache._shards(ns_dir) if ns_dir.is_dir() else []
        for path in listed:
            try:
                layout = verified_layout(path, checked)
                if layout.dtype != np.dtype(cache.dtype):
                    raise _CorruptShard(f"{layout.dtype} rows in a {cache.dtype} namespace")
                if layouts and layout.dim != layouts[0].dim:
                    raise _CorruptShard(f"{layout.dim}-d rows in a {layouts[0].dim}-d namespace")
                hashes = np.array(layout.memmap(path, "hashes"))  # 16 bytes a row, read once
            except FileNotFoundError:  # set aside by another process since the listing
                continue
            except _CorruptShard as e:
                cache._set_aside(path, str(e))
                continue
            shards.append(path)
            layouts.append(layout)
            parts.append(np.ascontiguousarray(hashes).view("S16").ravel())
        if not parts:
            empty = np.zeros(0, dtype=np.int32)
            return cls(shards, layouts, np.zeros(0, dtype="S16"), empty, empty)
        keys = np.concatenate(parts)
        shard = np.concatenate([np.full(len(p), s, dtype=np.int32) for s, p in enumerate(parts)])
        row = np.concatenate([np.arange(len(p), dtype=np.int32) for p in parts])
        order = np.argsort(keys, kind="stable")  # equal hashes keep listing order: the first shard wins
        return cls(shards, layouts, keys[order], shard[order], row[order])

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(shard, row)`` arrays for ``keys`` (:func:`hash_keys`); ``shard`` is -1 where not cached."""
        if not len(self._keys):
            return np.full(len(keys), -1, dtype=np.int32), np.zeros(len(keys), dtype=np.int32)
        pos = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        found = self._keys[pos] == keys
        return np.where(found, self._shard[pos], -1).astype(np.int32), np.where(found, self._row[pos], 0)


class CachedEmbeddings:
    """A read-only, lazy ``len(texts) x dim`` float32 matrix over memory-mapped shards (from
    :meth:`EmbeddingCache.view`): only the rows asked for are read (``view[i]``, ``view[a:b]``,
    ``view[array]``, :meth:`iter_batches`, :meth:`iter_storage_order`, :meth:`to_numpy`), the model's heads
    and ``Normalize`` applied, so rows equal what ``encode`` returns.
    """

    def __init__(self, shards: list[Path], layouts: list[ShardLayout], shard: np.ndarray, row: np.ndarray,
                 modules: list, dim: int):
        self._shards, self._layouts = shards, layouts
        self._shard, self._row = shard, row
        self._modules = modules
        self._stored_dim = layouts[0].dim if layouts else dim
        self.stored_dtype = layouts[0].dtype if layouts else None
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()
        if modules and len(shard):  # a head may change the width: ask it once
            dim = apply_embedding_modules(modules, np.zeros((1, self._stored_dim), dtype=np.float32)).shape[1]
        elif layouts:
            dim = self._stored_dim
        self.shape = (len(shard), int(dim))
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return (f"CachedEmbeddings(shape={self.shape}, stored={self.stored_dtype}, "
                f"shards={len(self._shards)})")

    def _array(self, s: int) -> np.ndarray:
        """Shard ``s``'s embeddings as a memory map; at most ``_OPEN_MAPS`` stay open."""
        arr = self._maps.get(s)
        if arr is None:
            arr = self._layouts[s].memmap(self._shards[s])
            self._maps[s] = arr
            if len(self._maps) > _OPEN_MAPS:
                self._maps.popitem(last=False)
        else:
            self._maps.move_to_end(s)
        return arr

    def _stored_rows(self, positions: np.ndarray) -> np.ndarray:
        """Rows at ``positions`` as float32, before the embedding modules, read shard by shard."""
        out = np.empty((len(positions), self._stored_dim), dtype=np.float32)
        if not len(positions):
            return out
        shard, row = self._shard[positions], self._row[positions]
        order = np.argsort(shard.astype(np.int64) << 32 | row, kind="stable")  # each shard once, rows ascending
        cuts = np.flatnonzero(np.diff(shard[order])) + 1
        for group in np.split(order, cuts):
            arr = self._array(int(shard[group[0]]))
            out[group] = arr[row[group]]
            _release_pages(arr)
        return out

    def rows(self, positions) -> np.ndarray:
        """Rows at ``positions`` (int array / list) as float32, embedding modules applied."""
        positions = np.asarray(positions, dtype=np.int64)
        return apply_embedding_modules(self._modules, self._stored_rows(positions))

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            i = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= i < len(self):
                raise IndexError(f"row {key} out of range for {len(self)} rows")
            return self.rows([i])[0]
        if isinstance(key, slice):
            return self.rows(np.arange(len(self))[key])
        key = np.asarray(key)
        if key.dtype == bool:
            if key.shape != (len(self),):
                raise IndexError(f"boolean index of shape {key.shape} for {len(self)} rows")
            key = np.flatnonzero(key)
        if key.ndim != 1 or (len(key) and key.dtype.kind not in "iu"):
            raise IndexError("index rows with an int, a slice, a 1-d integer array or a boolean mask")
        if len(key) and (key.min() < -len(self) or key.max() >= len(self)):
            raise IndexError(f"row index out of range for {len(self)} rows")
        return self.rows(np.where(key < 0, key + len(self), key))

    def iter_batches(self, batch_size: int = 8192) -> Iterator[np.ndarray]:
        """The rows in text order, ``batch_size`` rows at a time (float32, embedding modules applied)."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        for start in range(0, len(self), batch_size):
            yield self.rows(np.arange(start, min(start + batch_size, len(self))))

    def iter_storage_order(self, batch_size: int = 8192) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(positions, rows)`` covering every row once in on-disk order (the fast way to stream a corpus):
        ``rows[k]`` is the embedding of ``texts[positions[k]]``."""
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        order = np.argsort(self._shard.astype(np.int64) << 32 | self._row, kind="stable")
        for start in range(0, len(order), batch_size):
            positions = order[start : start + batch_size]
            yield positions, self.rows(positions)

    def to_numpy(self) -> np.ndarray:
        """The whole matrix in memory (float32)."""
        return self.rows(np.arange(len(self)))

    def __array__(self, dtype=None, copy=None):
        out = self.to_numpy()
        return out if dtype is None else out.astype(dtype, copy=False)
