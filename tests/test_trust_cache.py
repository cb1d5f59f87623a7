"""Trust tests for the embedding cache (docs/cache.md): corrupt shards are detected, set aside and re-encoded;
non-finite encoder output is never cached; two writers of one namespace encode each text once; long texts
are clipped before tokenization without changing any embedding."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

from medadapt.cache import (
    CLIP_CHARS_PER_TOKEN,
    CacheCorruptionWarning,
    EmbeddingCache,
    clip_text,
    namespace_lock,
    text_hash,
)
from medadapt.errors import MedAdaptError

pytestmark = pytest.mark.usefixtures("_single_thread")

TEXTS = [f"note {i}: gout toe uric acid " + "asthma inhaler wheezing " * (i % 4) for i in range(10)]


def _ns_dir(root: Path) -> Path:
    (ns,) = [p for p in root.iterdir() if p.is_dir()]
    return ns


def _shards(root: Path) -> list[Path]:
    return sorted(root.glob("*/shard-*.safetensors"))


def _rows_stored(root: Path) -> int:
    from safetensors.numpy import load_file

    return sum(len(load_file(str(s))["hashes"]) for s in _shards(root))


def _shard_of(root: Path, text: str) -> Path:
    from safetensors.numpy import load_file

    h = np.frombuffer(text_hash(text), dtype=np.uint8)
    (shard,) = [s for s in _shards(root) if (load_file(str(s))["hashes"] == h).all(1).any()]
    return shard


def _tensor_span(path: Path, name: str) -> tuple[int, int]:
    """Byte range of tensor ``name``'s data in a safetensors file."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    start, end = json.loads(data[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + start, 8 + n + end


# ---------------------------------------------------------------- corruption: each returns a description
def _flip_embedding_byte(shard: Path) -> None:
    start, end = _tensor_span(shard, "embeddings")
    data = bytearray(shard.read_bytes())
    data[start + 4 * 5 + 3] ^= 0x40  # exponent byte of row 0, value 5: a large, finite change
    shard.write_bytes(bytes(data))


def _flip_hash_byte(shard: Path) -> None:
    start, _ = _tensor_span(shard, "hashes")
    data = bytearray(shard.read_bytes())
    data[start + 7] ^= 0x01
    shard.write_bytes(bytes(data))


def _nan_row_in_place(shard: Path) -> None:  # the checksum in the metadata is kept: it must not match
    start, end = _tensor_span(shard, "embeddings")
    data = bytearray(shard.read_bytes())
    data[start : start + 8] = np.full(2, np.nan, dtype=np.float32).tobytes()
    shard.write_bytes(bytes(data))


def _nan_row_resaved(shard: Path) -> None:  # re-saved without metadata, like a pre-checksum shard (audit p4)
    from safetensors.numpy import load_file, save_file

    d = load_file(str(shard))
    d["embeddings"][1] = np.nan
    save_file(d, str(shard))


def _float64_legacy(shard: Path) -> None:
    from safetensors.numpy import load_file, save_file

    d = load_file(str(shard))
    save_file({"hashes": d["hashes"], "embeddings": d["embeddings"].astype(np.float64)}, str(shard))


def _truncate(shard: Path) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])


CORRUPTIONS = {
    "flipped-embedding-byte": _flip_embedding_byte,
    "flipped-hash-byte": _flip_hash_byte,
    "nan-row-in-place": _nan_row_in_place,
    "nan-row-no-checksum": _nan_row_resaved,
    "float64-no-checksum": _float64_legacy,
    "truncated": _truncate,
}


@pytest.mark.parametrize("corrupt", list(CORRUPTIONS))
def test_corrupt_shard_is_set_aside_and_reencoded_in_the_same_call(tiny_bert, tmp_path, corrupt):
    cache = EmbeddingCache(tmp_path, chunk_size=4)
    cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    assert len(_shards(tmp_path)) == 3 and _rows_stored(tmp_path) == len(TEXTS)
    shard = _shard_of(tmp_path, TEXTS[0])
    CORRUPTIONS[corrupt](shard)
    expected = tiny_bert.encode_document(TEXTS)

    with pytest.warns(CacheCorruptionWarning, match=shard.name) as record:
        got = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    assert sum(issubclass(w.category, CacheCorruptionWarning) for w in record) == 1  # warned once
    np.testing.assert_allclose(got, expected, atol=1e-5)  # never a row of the corrupt shard
    assert not shard.exists() and (shard.parent / f"corrupt-{shard.name}").is_file()  # set aside, kept
    assert _rows_stored(tmp_path) == len(TEXTS)  # its texts were re-encoded into a new shard

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cache works again, with no warning at all
        again = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
        assert cache.count_missing(tiny_bert, TEXTS, role="document") == 0
    np.testing.assert_array_equal(again, got)


def test_corrupt_shard_found_by_count_missing_is_set_aside(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path, chunk_size=4)
    cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    shard = _shard_of(tmp_path, TEXTS[0])
    _truncate(shard)
    with pytest.warns(CacheCorruptionWarning, match="corrupt"):
        assert cache.count_missing(tiny_bert, TEXTS, role="document") == 4
    assert not shard.exists()


def test_shards_without_checksum_stay_readable(tiny_bert, tmp_path, monkeypatch):
    """Shards written before checksums existed (no safetensors metadata) are read without a warning or a
    re-encode."""
    from safetensors import safe_open
    from safetensors.numpy import load_file, save_file

    cache = EmbeddingCache(tmp_path, chunk_size=4)
    first = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    for shard in _shards(tmp_path):
        with safe_open(str(shard), framework="numpy") as f:
            meta = f.metadata()
        assert meta and len(meta["sha256_embeddings"]) == 64 and len(meta["sha256_hashes"]) == 64
        save_file(load_file(str(shard)), str(shard))  # the old format: no metadata
    before = sorted(p.name for p in _ns_dir(tmp_path).iterdir())

    def no_encoding(*args, **kwargs):
        raise AssertionError("a readable old shard was re-encoded")

    monkeypatch.setattr(EmbeddingCache, "_encode_missing", no_encoding)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    np.testing.assert_array_equal(got, first)
    assert sorted(p.name for p in _ns_dir(tmp_path).iterdir()) == before


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_nonfinite_encoder_output_is_refused_and_nothing_written(tiny_bert, tmp_path, monkeypatch, dtype):
    from sentence_transformers import SentenceTransformer

    real = SentenceTransformer.encode_document

    def broken(self, texts, **kwargs):
        emb = np.asarray(real(self, texts, **kwargs), dtype=np.float32)
        if dtype == "float32":
            emb[[1, 3]] = np.nan
            emb[2, 0] = np.inf
        else:
            emb[1] = 1e6  # finite in float32, inf once stored as float16
        return emb

    monkeypatch.setattr(SentenceTransformer, "encode_document", broken)
    cache = EmbeddingCache(tmp_path, dtype=dtype)
    count = "3 of 10 texts" if dtype == "float32" else "1 of 10 texts.*float16"
    with pytest.raises(MedAdaptError, match=count):
        cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    assert not _shards(tmp_path)
    assert not [p for p in _ns_dir(tmp_path).iterdir() if p.name.endswith(".tmp")]
    monkeypatch.setattr(SentenceTransformer, "encode_document", real)
    got = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    np.testing.assert_allclose(got, tiny_bert.encode_document(TEXTS), atol=2e-3 if dtype == "float16" else 1e-5)


# ---------------------------------------------------------------- concurrent writers
WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    import torch
    torch.set_num_threads(1)
    from sentence_transformers import SentenceTransformer
    from medadapt.cache import EmbeddingCache

    model_dir, root, sync, me, out = sys.argv[1:]
    model = SentenceTransformer(model_dir, device="cpu")
    texts = [f"case {i}: gout toe uric acid " + "asthma inhaler " * (i % 5) for i in range(300)]
    Path(sync, "ready-" + me).touch()
    deadline = time.time() + 120
    while len(list(Path(sync).glob("ready-*"))) < 2 and time.time() < deadline:  # start encode together
        time.sleep(0.005)
    np.save(out, EmbeddingCache(root, chunk_size=25).encode(model, texts, role="document", show_progress=False))
    """
)


def test_two_writer_processes_encode_each_text_once(tiny_bert, tiny_bert_dir, tmp_path):
    """This test process and a child process fill one namespace at the same moment (a file barrier lines
    up their ``encode`` calls): each text is encoded and stored once, and both get the same rows."""
    import os
    import time

    root, sync = tmp_path / "cache", tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    child = subprocess.Popen([sys.executable, "-c", WORKER, str(tiny_bert_dir), str(root), str(sync), "1",
                              str(tmp_path / "out1.npy")], env=env, stderr=subprocess.PIPE, text=True)
    try:
        (sync / "ready-0").touch()
        deadline = time.time() + 180
        while not (sync / "ready-1").exists() and child.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        texts = [f"case {i}: gout toe uric acid " + "asthma inhaler " * (i % 5) for i in range(300)]
        mine = EmbeddingCache(root, chunk_size=25).encode(tiny_bert, texts, role="document", show_progress=False)
        _, err = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err[-2000:]
    assert _rows_stored(root) == len(set(texts)) == 300  # without the lock both wrote all 300 (600 rows)
    theirs = np.load(tmp_path / "out1.npy")
    np.testing.assert_array_equal(mine, theirs)
    np.testing.assert_allclose(mine, tiny_bert.encode_document(texts), atol=1e-5)
    assert (_ns_dir(root) / ".lock").is_file()


def test_writer_that_waited_on_the_lock_encodes_only_what_is_still_missing(tiny_bert, tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path, chunk_size=4)
    cache.encode(tiny_bert, TEXTS[:6], role="document", show_progress=False)  # "the other process" wrote these
    ns_dir = _ns_dir(tmp_path)
    encoded = []
    real = EmbeddingCache._encode_locked

    def spy(self, model, ns_dir, missing, *args):
        encoded.extend(missing.values())
        return real(self, model, ns_dir, missing, *args)

    monkeypatch.setattr(EmbeddingCache, "_encode_locked", spy)
    # the caller's index (taken before the lock) still thought all 10 were missing
    missing = {text_hash(t): t for t in TEXTS}
    cache._encode_missing(tiny_bert, ns_dir, missing, "document", "", 64, False, None)
    assert sorted(encoded) == sorted(TEXTS[6:])
    cache._encode_missing(tiny_bert, ns_dir, missing, "document", "", 64, False, None)
    assert sorted(encoded) == sorted(TEXTS[6:])  # everything present: nothing encoded, no shard written
    assert _rows_stored(tmp_path) == len(TEXTS)


def test_readers_never_take_the_lock(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path)
    expected = cache.encode(tiny_bert, TEXTS, role="document", show_progress=False)
    result = {}
    with namespace_lock(_ns_dir(tmp_path)):  # a writer holds the namespace (flock: per open file, so a
        reader = threading.Thread(  # second flock in this process would block like another process's)
            target=lambda: result.setdefault("out", cache.encode(tiny_bert, TEXTS, role="document",
                                                                 show_progress=False)),
            daemon=True,
        )
        reader.start()
        reader.join(timeout=60)
        assert not reader.is_alive(), "a cached read waited for the writer's lock"
    np.testing.assert_array_equal(result["out"], expected)


# ---------------------------------------------------------------- long texts
def _long_text(chars: int) -> str:
    words = "gout toe uric acid crystals asthma inhaler wheezing migraine aura light nausea".split()
    out = " ".join(words[i % len(words)] + ("." if i % 9 == 8 else "") for i in range(chars // 4))
    return out[:chars]


def test_clip_budget_never_changes_the_embedding(tiny_bert):
    max_len = tiny_bert.max_seq_length
    long = _long_text(max_len * 50)
    clipped = clip_text(tiny_bert, long)
    assert len(clipped) == max_len * CLIP_CHARS_PER_TOKEN < len(long) and long.startswith(clipped)
    for encode in (tiny_bert.encode_document, tiny_bert.encode_query, tiny_bert.encode):
        np.testing.assert_allclose(encode([clipped]), encode([long]), atol=1e-6)
    short = _long_text(max_len * CLIP_CHARS_PER_TOKEN)
    assert clip_text(tiny_bert, short) is short  # within the budget: untouched


def test_clip_widens_for_text_that_yields_few_tokens(tiny_bert):
    """Mostly whitespace up front: a plain cut at the budget would keep no words at all."""
    max_len = tiny_bert.max_seq_length
    text = " " * (max_len * CLIP_CHARS_PER_TOKEN * 2) + _long_text(max_len * 200)
    naive = text[: max_len * CLIP_CHARS_PER_TOKEN]
    clipped = clip_text(tiny_bert, text)
    assert len(naive) < len(clipped) < len(text)
    full = tiny_bert.encode_document([text])
    np.testing.assert_allclose(tiny_bert.encode_document([clipped]), full, atol=1e-6)
    assert not np.allclose(tiny_bert.encode_document([naive]), full, atol=1e-3)


def test_the_model_never_sees_more_than_the_budget(tiny_bert, tmp_path, monkeypatch):
    from sentence_transformers import SentenceTransformer

    budget = tiny_bert.max_seq_length * CLIP_CHARS_PER_TOKEN
    huge = _long_text(1_000_000)
    seen = []
    real = SentenceTransformer.encode_document

    def spy(self, texts, **kwargs):
        seen.extend(texts)
        return real(self, texts, **kwargs)

    monkeypatch.setattr(SentenceTransformer, "encode_document", spy)
    cache = EmbeddingCache(tmp_path)
    got = cache.encode(tiny_bert, [huge, "gout toe"], role="document", show_progress=False)
    assert max(len(t) for t in seen) <= budget and len(seen) == 2
    monkeypatch.setattr(SentenceTransformer, "encode_document", real)
    np.testing.assert_allclose(got[1], tiny_bert.encode_document(["gout toe"])[0], atol=1e-5)
    np.testing.assert_allclose(got[0], tiny_bert.encode_document([huge[:budget]])[0], atol=1e-5)
    assert cache.count_missing(tiny_bert, [huge], role="document") == 0  # keyed by the full text
    assert cache.count_missing(tiny_bert, [huge[:budget]], role="document") == 1
