"""Out-of-core reads of the embedding cache (docs/cache.md, "Out-of-core and distributed encoding"):
float16 storage in its own namespace, lazy memory-mapped views equal to ``encode``, streaming iteration,
shards verified once per process (and still refused when corrupt)."""

from __future__ import annotations

import json
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest

import medadapt.cache_shards as cache_mod
from medadapt.cache import (
    CacheCorruptionWarning,
    CachedEmbeddings,
    EmbeddingCache,
    ShardIndex,
    hash_keys,
    text_hash,
)
from medadapt.errors import MedAdaptError

pytestmark = pytest.mark.usefixtures("_single_thread")

TEXTS = [f"note {i}: gout toe uric acid " + "asthma inhaler wheezing " * (i % 5) for i in range(23)]


def _shards(root: Path) -> list[Path]:
    return sorted(root.glob("*/shard-*.safetensors"))


@pytest.fixture(autouse=True)
def _fresh_process_memory():
    """Each test starts as a new process would: no shard remembered as verified."""
    cache_mod._VERIFIED.clear()
    yield
    cache_mod._VERIFIED.clear()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("normalize", [True, False])
def test_view_equals_encode_row_for_row(tiny_bert, tmp_path, dtype, normalize):
    cache = EmbeddingCache(tmp_path, chunk_size=5, dtype=dtype)
    full = cache.encode(tiny_bert, TEXTS, role="document", normalize=normalize, show_progress=False)
    view = cache.view(tiny_bert, TEXTS, role="document", normalize=normalize)
    assert isinstance(view, CachedEmbeddings) and view.shape == full.shape == (23, 32)
    assert view.dtype == np.float32 and view.stored_dtype == np.dtype(dtype)
    np.testing.assert_array_equal(view.to_numpy(), full)
    np.testing.assert_array_equal(np.asarray(view), full)
    np.testing.assert_array_equal(view[3], full[3])
    np.testing.assert_array_equal(view[-1], full[-1])
    np.testing.assert_array_equal(view[2:17:3], full[2:17:3])
    np.testing.assert_array_equal(view[[22, 0, 0, 7]], full[[22, 0, 0, 7]])
    mask = np.arange(23) % 4 == 1
    np.testing.assert_array_equal(view[mask], full[mask])
    # a subset in another order, with a repeat, is served by the same shards
    order = [5, 1, 1, 22, 9]
    np.testing.assert_array_equal(cache.view(tiny_bert, [TEXTS[i] for i in order], role="document",
                                             normalize=normalize).to_numpy(), full[order])
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(full, axis=1), 1.0, atol=1e-3)


def test_float16_is_stored_as_float16_in_its_own_namespace(tiny_bert, tmp_path):
    f32 = EmbeddingCache(tmp_path, chunk_size=100)
    f16 = EmbeddingCache(tmp_path, chunk_size=100, dtype="float16")
    a = f32.encode(tiny_bert, TEXTS, role="document", normalize=False, show_progress=False)
    with pytest.raises(MedAdaptError, match=r"23 of 23 texts are not in the embedding cache .*float16"):
        f16.view(tiny_bert, TEXTS, role="document")  # float32 rows are never served as float16 ones
    b = f16.view(tiny_bert, TEXTS, role="document", normalize=False, encode_missing=True, show_progress=False)
    np.testing.assert_allclose(b.to_numpy(), a, rtol=1e-3, atol=1e-3)  # float16 rounding only
    np.testing.assert_array_equal(b.to_numpy(), a.astype(np.float16).astype(np.float32))
    dirs = {p.parent for p in _shards(tmp_path)}
    assert len(dirs) == 2  # two namespaces
    sizes = sorted(sum(s.stat().st_size for s in d.glob("shard-*.safetensors")) for d in dirs)
    assert sizes[0] < 0.6 * sizes[1]  # float16 payload ~half of float32's
    metas = sorted(json.loads((d / "meta.json").read_text())["dtype"] for d in dirs)
    assert metas == ["float16", "float32"]


def test_a_float32_shard_in_a_float16_namespace_is_set_aside(tiny_bert, tmp_path):
    f32 = EmbeddingCache(tmp_path / "a", chunk_size=100)
    f16 = EmbeddingCache(tmp_path / "b", chunk_size=100, dtype="float16")
    f32.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    f16.encode(tiny_bert, TEXTS[:3], role="document", show_progress=False)
    (foreign,) = _shards(tmp_path / "a")
    (ns16,) = {p.parent for p in _shards(tmp_path / "b")}
    copied = ns16 / foreign.name
    copied.write_bytes(foreign.read_bytes())  # a shard from another cache copied in by hand
    with pytest.warns(CacheCorruptionWarning, match="float32 rows in a float16 namespace"):
        view = f16.view(tiny_bert, TEXTS, role="document", encode_missing=True, show_progress=False)
    assert not copied.exists() and (ns16 / f"corrupt-{copied.name}").is_file()
    assert view.stored_dtype == np.float16


def test_nothing_is_read_until_rows_are_asked_for(tiny_bert, tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path, chunk_size=5)
    full = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    assert len(_shards(tmp_path)) == 5
    mapped: list[tuple[str, str]] = []
    real = cache_mod.ShardLayout.memmap

    def spy(self, path, name="embeddings"):
        mapped.append((Path(path).name, name))
        arr = real(self, path, name)
        if name == "embeddings":
            assert isinstance(arr, np.memmap)  # rows come from the file, not a loaded copy
        return arr

    monkeypatch.setattr(cache_mod.ShardLayout, "memmap", spy)
    view = cache.view(tiny_bert, TEXTS, role="document")
    assert all(name == "hashes" for _, name in mapped)  # building the view reads the 16-byte hashes only
    mapped.clear()
    row = view[0]
    np.testing.assert_array_equal(row, full[0])
    assert len(mapped) == 1  # exactly the one shard holding that row
    mapped.clear()
    view[[0, 1]]
    assert len([m for m in mapped if m[1] == "embeddings"]) <= 1


def test_iter_embeddings_streams_in_order(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path, chunk_size=4)
    full = cache.encode(tiny_bert, TEXTS, role="query", show_progress=False)
    batches = list(cache.iter_embeddings(tiny_bert, TEXTS, role="query", batch_size=10))
    assert [len(b) for b in batches] == [10, 10, 3]
    np.testing.assert_array_equal(np.concatenate(batches), full)
    with pytest.raises(MedAdaptError, match="1 of 24 texts are not in the embedding cache"):
        list(cache.iter_embeddings(tiny_bert, [*TEXTS, "never encoded"], role="query"))
    with pytest.raises(ValueError, match="batch_size"):
        list(cache.iter_embeddings(tiny_bert, TEXTS, role="query", batch_size=0))


def test_storage_order_covers_every_row_once(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path, chunk_size=6)
    texts = TEXTS + TEXTS[:4]  # repeats point at the same stored row
    full = cache.encode(tiny_bert, texts, role="document", show_progress=False)
    view = cache.view(tiny_bert, texts, role="document")
    seen = []
    for positions, rows in view.iter_storage_order(batch_size=7):
        np.testing.assert_array_equal(rows, full[positions])
        seen += positions.tolist()
    assert sorted(seen) == list(range(len(texts)))


def test_view_of_missing_texts_encodes_them_when_asked(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path, chunk_size=8)
    view = cache.view(tiny_bert, TEXTS, role="document", encode_missing=True, show_progress=False)
    np.testing.assert_allclose(view.to_numpy(), tiny_bert.encode_document(TEXTS), atol=1e-5)
    assert len(_shards(tmp_path)) == 3
    empty = cache.view(tiny_bert, [], role="document")
    assert empty.shape == (0, 32) and empty.to_numpy().shape == (0, 32)


def test_bad_row_indexes_are_refused(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path)
    view = cache.view(tiny_bert, TEXTS[:3], role="document", encode_missing=True, show_progress=False)
    for bad in (3, -4):
        with pytest.raises(IndexError, match="out of range"):
            view[bad]
    with pytest.raises(IndexError, match="out of range"):
        view[[0, 3]]
    with pytest.raises(IndexError, match="boolean index"):
        view[np.array([True, False])]
    with pytest.raises(IndexError, match="integer array"):
        view[np.array([0.5])]


def test_shards_are_verified_once_per_process(tiny_bert, tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path, chunk_size=5)
    full = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    assert len(cache_mod._VERIFIED) == 5  # shards this process wrote count as verified
    cache_mod._VERIFIED.clear()  # as a fresh process
    checked: list[str] = []
    real = cache_mod._stream_check
    monkeypatch.setattr(cache_mod, "_stream_check",
                        lambda f, layout, name, keep=False: (checked.append(name), real(f, layout, name, keep))[1])
    monkeypatch.setattr(cache_mod, "_VERIFY_CHUNK", 64)  # many pieces per tensor: streaming stays exact
    cache.view(tiny_bert, TEXTS, role="document")
    assert sorted(checked) == ["embeddings"] * 5 + ["hashes"] * 5
    checked.clear()
    again = cache.view(tiny_bert, TEXTS, role="document")
    assert checked == []  # remembered: memory-mapped reads cost no re-hashing
    np.testing.assert_array_equal(again.to_numpy(), full)


def _tensor_span(path: Path, name: str) -> tuple[int, int]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    start, end = json.loads(data[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


def _flip_embedding_byte(shard: Path) -> None:
    start, _ = _tensor_span(shard, "embeddings")
    data = bytearray(shard.read_bytes())
    data[start + 4 * 3 + 3] ^= 0x40
    shard.write_bytes(bytes(data))


def _nan_in_place(shard: Path) -> None:
    start, _ = _tensor_span(shard, "embeddings")
    data = bytearray(shard.read_bytes())
    data[start : start + 4] = np.float32(np.nan).tobytes()
    shard.write_bytes(bytes(data))


def _truncate(shard: Path) -> None:
    shard.write_bytes(shard.read_bytes()[:-10])


def _garble_header(shard: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[10:14] = b"\xff\xfe{]"
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize("corrupt", [_flip_embedding_byte, _nan_in_place, _truncate, _garble_header],
                         ids=["flipped-byte", "nan", "truncated", "garbled-header"])
def test_corrupt_shard_is_never_served_by_a_view(tiny_bert, tmp_path, corrupt):
    cache = EmbeddingCache(tmp_path, chunk_size=5)
    full = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    cache_mod._VERIFIED.clear()  # a fresh process reads the cache
    shard = _shards(tmp_path)[0]
    rows = len(cache_mod.read_hashes(shard))  # 5, or 3 for the last chunk
    corrupt(shard)
    with pytest.warns(CacheCorruptionWarning, match=shard.name), \
            pytest.raises(MedAdaptError, match=f"{rows} of 23 texts are not in the embedding cache"):
        cache.view(tiny_bert, TEXTS, role="document")
    assert (shard.parent / f"corrupt-{shard.name}").is_file()
    view = cache.view(tiny_bert, TEXTS, role="document", encode_missing=True, show_progress=False)
    np.testing.assert_allclose(view.to_numpy(), full, atol=1e-6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.view(tiny_bert, TEXTS, role="document")


def test_a_shard_changed_after_verification_is_checked_again(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path, chunk_size=5)
    cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    cache.view(tiny_bert, TEXTS, role="document")
    shard = _shards(tmp_path)[1]
    _truncate(shard)  # new size: the remembered verification no longer applies
    with pytest.warns(CacheCorruptionWarning, match=shard.name):
        view = cache.view(tiny_bert, TEXTS, role="document", encode_missing=True, show_progress=False)
    assert len(view) == 23


def test_legacy_shard_without_checksums_is_readable(tiny_bert, tmp_path):
    from safetensors.numpy import load_file, save_file

    cache = EmbeddingCache(tmp_path, chunk_size=100)
    full = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    (shard,) = _shards(tmp_path)
    save_file(load_file(str(shard)), str(shard))  # no metadata, like a shard from before checksums
    cache_mod._VERIFIED.clear()
    np.testing.assert_array_equal(cache.view(tiny_bert, TEXTS, role="document").to_numpy(), full)


def test_shard_index_finds_every_hash_and_reports_misses(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path, chunk_size=4)
    cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    index = cache.shard_index(tiny_bert, "document")
    assert isinstance(index, ShardIndex) and len(index) == 23 and len(index.shards) == 6 and index.dim == 32
    keys = hash_keys([text_hash(t) for t in [*TEXTS, "absent"]])
    shard, row = index.lookup(keys)
    assert (shard[:-1] >= 0).all() and shard[-1] == -1
    for i, text in enumerate(TEXTS):  # each hit names the shard and row that hold the text's hash
        hashes = index.layouts[shard[i]].memmap(index.shards[shard[i]], "hashes")
        assert hashes[row[i]].tobytes() == text_hash(text)
    empty = EmbeddingCache(tmp_path / "none").shard_index(tiny_bert, "document")
    assert len(empty) == 0 and (empty.lookup(keys)[0] == -1).all()
