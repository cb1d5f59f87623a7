"""Sharded dense builds: :func:`train_shard_template` trains once, :func:`build_shard` adds one slice per
machine, :func:`merge_shards` merges IVF lists (optionally on disk) or flat codes, or serves HNSW shards side by
side. FAISS does the work; a ``<file>.sha256`` beside every file is checked before FAISS parses it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from medadapt.identity import sha256_file
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_write_text
from medadapt.retrieval.config import DenseConfig
from medadapt.retrieval.dense import DenseIndex, _hnsw, default_train_size, new_index, normalize


def _write(index, out: Path) -> Path:
    """``faiss.write_index`` to a temporary sibling, its checksum beside it, then both renamed into place."""
    import faiss

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    faiss.write_index(index, str(tmp))
    atomic_write_text(out.with_name(out.name + ".sha256"), f"{sha256_file(tmp)}  {out.name}\n")
    tmp.replace(out)
    return out


def _read(path: str | Path):
    """``faiss.read_index`` after the file matches its ``.sha256``."""
    import faiss

    return faiss.read_index(str(_verify(path)))


def _verify(path: str | Path) -> Path:
    """``path`` after it matches its ``.sha256`` (hashed, never parsed)."""
    path = Path(path)
    sums = path.with_name(path.name + ".sha256")
    try:
        recorded = sums.read_text(encoding="ascii").split()[0]
    except (OSError, ValueError, IndexError):
        raise MedAdaptError(f"{path}: no readable {sums.name} beside it (written by build_shard / "
                            "train_shard_template); build the shard again") from None
    if not path.is_file() or sha256_file(path) != recorded:
        raise MedAdaptError(f"{path}: missing, or differs from {sums.name} (truncated or modified); build it again")
    return path


def train_shard_template(sample: np.ndarray, config: DenseConfig, out: str | Path, normalized: bool = True) -> Path:
    """Train an empty index of ``config.factory`` on ``sample`` and write it to ``out``."""
    index = new_index(sample.shape[1], config.factory)
    if not index.is_trained:
        n = config.train_size or default_train_size(index)
        x = normalize(sample[:n]) if normalized else np.ascontiguousarray(sample[:n], dtype=np.float32)
        index.train(x)
    return _write(index, Path(out))


def build_shard(template: str | Path, vectors: np.ndarray, start: int, out: str | Path,
                normalized: bool = True, ef_construction: int = 40) -> Path:
    """Add ``vectors`` (global positions ``start .. start+len-1``) to a copy of the template, write ``out``."""
    import faiss

    index = _read(template)
    x = normalize(vectors) if normalized else np.ascontiguousarray(vectors, dtype=np.float32)
    ids = np.arange(start, start + len(x), dtype=np.int64)
    if faiss.try_extract_index_ivf(index) is not None:
        index.add_with_ids(x, ids)
    else:  # flat-code and graph indexes number vectors sequentially; remember the offset in the file name
        hnsw = _hnsw(index)
        if hnsw is not None:
            hnsw.efConstruction = ef_construction
        index.add(x)
    return _write(index, Path(out))


def merge_shards(shards: Sequence[str | Path], config: DenseConfig, normalized: bool = True,
                 ondisk: str | Path | None = None) -> DenseIndex:
    """Merge shard files of :func:`build_shard` (ordered by ``start``) into one :class:`DenseIndex`; ``ondisk``:
    for IVF indexes, a path for the merged, memory-mapped ``.ivfdata`` inverted lists."""
    import faiss

    if not shards:
        raise MedAdaptError("no shards to merge")
    merged = _read(shards[0])
    ivf = faiss.try_extract_index_ivf(merged) is not None
    if ivf and ondisk is not None:
        from faiss.contrib.ondisk import merge_ondisk

        for s in shards[1:]:  # merge_ondisk reads the files itself: check them first
            _verify(s)
        merged.reset()  # emptied: merge_ondisk fills its lists from the shard files
        merge_ondisk(merged, [str(s) for s in shards], str(ondisk))
    elif ivf or _hnsw(merged) is None:
        for s in shards[1:]:
            merged.merge_from(_read(s), 0)  # IVF ids are already global positions; flat codes append
    else:  # HNSW graphs cannot be merged: the shards are searched side by side (threaded, successive ids),
        first, merged = merged, faiss.IndexShards(merged.d, True, True)  # kept as the shard files
        for part in [first] + [_read(s) for s in shards[1:]]:
            merged.add_shard(part)  # the faiss wrapper keeps a reference to each shard
    return DenseIndex(merged, config, normalized)
