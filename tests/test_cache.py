from __future__ import annotations

import json

import numpy as np
import pytest

from medadapt.cache import EmbeddingCache


def test_cache_roundtrip_subset_and_order(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path / "c", chunk_size=4)
    texts = [f"symptoms of condition {i}" for i in range(10)]
    assert cache.count_missing(tiny_bert, texts + texts[:2], role="document") == 10
    first = cache.encode(tiny_bert, texts, role="document", show_progress=False)
    assert cache.count_missing(tiny_bert, texts, role="document") == 0
    direct = tiny_bert.encode_document(texts)
    np.testing.assert_allclose(first, direct, atol=1e-6)
    shards = list((tmp_path / "c").glob("*/shard-*.safetensors"))
    assert len(shards) == 3  # chunk_size 4 -> 4 + 4 + 2
    again = cache.encode(tiny_bert, texts[::-1][:5], role="document", show_progress=False)
    np.testing.assert_array_equal(again, first[::-1][:5])
    assert len(list((tmp_path / "c").glob("*/shard-*.safetensors"))) == 3  # nothing re-encoded


def test_cache_keys_separate_roles_prompts_and_weights(tiny_bert, tmp_path):
    cache = EmbeddingCache(tmp_path)
    texts = ["asthma inhaler"]
    q = cache.encode(tiny_bert, texts, role="query", show_progress=False)
    qp = cache.encode(tiny_bert, texts, role="query", prompt="query: ", show_progress=False)
    raw = cache.encode(tiny_bert, texts, role="query", normalize=False, show_progress=False)
    assert not np.allclose(q, qp)
    assert np.linalg.norm(raw) != pytest.approx(1.0)
    np.testing.assert_allclose(raw / np.linalg.norm(raw), q, atol=1e-5)
    import torch

    with torch.no_grad():
        p = next(tiny_bert.parameters())
        p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))  # not a constant: LayerNorm
    cache2 = EmbeddingCache(tmp_path)  # fresh fingerprint memo
    changed = cache2.encode(tiny_bert, texts, role="query", show_progress=False)
    assert not np.allclose(changed, q)
    # one namespace serves normalised and raw outputs; prompts and weights get their own
    assert len(list(tmp_path.glob("*/meta.json"))) == 3


def test_cache_keys_follow_the_tokenizer_and_the_token_limit(tiny_bert_dir, tmp_path):
    """Same weights, other tokenisation (no lowercasing) or a shorter token limit: other embeddings, so
    another namespace; each model gets from the cache exactly what its own ``encode`` gives."""
    import shutil

    import medadapt

    cache = EmbeddingCache(tmp_path / "c")
    texts = ["ASTHMA Inhaler and wheezing", "what causes gout in the big toe joint at night"]
    first = medadapt.load(str(tiny_bert_dir), device="cpu")
    cached_first = cache.encode(first, texts, show_progress=False)
    cased = tmp_path / "cased"
    shutil.copytree(tiny_bert_dir, cased)
    definition = json.loads((cased / "tokenizer.json").read_text())
    definition["normalizer"]["lowercase"] = False
    (cased / "tokenizer.json").write_text(json.dumps(definition))
    second = medadapt.load(str(cased), device="cpu")
    direct = second.encode(texts, convert_to_numpy=True)
    assert not np.allclose(direct[0], cached_first[0], atol=1e-4)  # the edit matters for the first text
    np.testing.assert_allclose(cache.encode(second, texts, show_progress=False), direct, atol=1e-5)
    first.max_seq_length = 4  # truncates the second text much earlier
    direct = first.encode(texts, convert_to_numpy=True)
    assert not np.allclose(direct[1], cached_first[1], atol=1e-4)
    np.testing.assert_allclose(cache.encode(first, texts, show_progress=False), direct, atol=1e-5)
    assert len(list((tmp_path / "c").glob("*/meta.json"))) == 3


def test_tokenizer_fingerprint_is_what_it_does_not_which_class_loaded_it(tiny_bert_dir):
    """The same files loaded by two tokenizer classes give the same ids, so the same fingerprint (an adapter
    saved under one transformers version loads under another); lowercasing off changes it."""
    from transformers import AutoTokenizer, BertTokenizer

    from medadapt.identity import tokenizer_fingerprint

    auto, bert = AutoTokenizer.from_pretrained(tiny_bert_dir), BertTokenizer.from_pretrained(tiny_bert_dir)
    assert type(auto) is not type(bert)
    assert tokenizer_fingerprint(auto) == tokenizer_fingerprint(bert)
    auto("Some text to set the call state", truncation=True, max_length=4, padding="max_length")
    assert tokenizer_fingerprint(auto) == tokenizer_fingerprint(bert)  # per-call state is not identity
    auto.backend_tokenizer.normalizer.lowercase = False
    assert tokenizer_fingerprint(auto) != tokenizer_fingerprint(bert)


def test_cache_killed_mid_run_leaves_no_partial_files(tiny_bert, tmp_path, monkeypatch):
    cache = EmbeddingCache(tmp_path, chunk_size=3)
    texts = [f"text number {i}" for i in range(9)]
    from sentence_transformers import SentenceTransformer

    calls = {"n": 0}
    real = SentenceTransformer.encode_document

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SentenceTransformer, "encode_document", flaky)
    with pytest.raises(KeyboardInterrupt):
        cache.encode(tiny_bert, texts, role="document", show_progress=False)
    files = [p.name for p in tmp_path.glob("*/*")]
    assert sum(f.startswith("shard-") for f in files) == 1 and not any(f.endswith(".tmp") for f in files)
    monkeypatch.setattr(SentenceTransformer, "encode_document", real)
    out = cache.encode(tiny_bert, texts, role="document", show_progress=False)  # resumes
    np.testing.assert_allclose(out, tiny_bert.encode_document(texts), atol=1e-6)
    assert len(list(tmp_path.glob("*/shard-*"))) == 3


def test_cache_rejects_bad_settings(tmp_path):
    with pytest.raises(ValueError):
        EmbeddingCache(tmp_path, dtype="int8")
    with pytest.raises(ValueError):
        EmbeddingCache(tmp_path, chunk_size=0)


def test_cache_serves_backbone_with_head_without_reencoding(tiny_bert, tmp_path):
    import torch

    from medadapt.adapters import attach
    from medadapt.moe import MoEConfig, MoEHead

    cache = EmbeddingCache(tmp_path)
    texts = [f"gout toe pain {i}" for i in range(6)]
    cache.encode(tiny_bert, texts, role="document", show_progress=False)
    shards = set(tmp_path.glob("*/shard-*"))
    head = MoEHead(MoEConfig.single_expert(32, "mlp_gelu", zero_init_output=False))
    attach(tiny_bert, head)
    with_head = cache.encode(tiny_bert, texts, role="document", show_progress=False)
    assert set(tmp_path.glob("*/shard-*")) == shards  # served from the backbone's cache
    with torch.no_grad():
        direct = tiny_bert.encode_document(texts)
    np.testing.assert_allclose(with_head, direct, atol=1e-5)
    raw = cache.encode(tiny_bert, texts, role="document", normalize=False, show_progress=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), direct, atol=1e-5)


def test_gather_reads_the_shards_its_index_was_built_from(tiny_bert, tmp_path, monkeypatch):
    """A writer adding a shard between indexing and gathering must not renumber the shards the index points
    into (listing the folder again made the new shard, sorting first, shard 0: rows came from it)."""
    from safetensors.numpy import save

    from medadapt.cache import text_hash

    cache = EmbeddingCache(tmp_path)
    texts = [f"note about gout {i}" for i in range(5)]
    expected = cache.encode(tiny_bert, texts, role="document", show_progress=False)  # one shard on disk
    (ns_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    real_index = EmbeddingCache._index
    written = []

    def index_then_concurrent_writer(self, folder, *args):
        out = real_index(self, folder, *args)
        if not written:  # another process finishes a chunk now; its file name sorts before every other
            others = [text_hash(f"other text {i}") for i in range(5)]
            payload = save({"hashes": np.frombuffer(b"".join(others), dtype=np.uint8).reshape(5, 16),
                            "embeddings": np.full((5, expected.shape[1]), 7.0, dtype=np.float32)})
            (folder / ("shard-" + "0" * 32 + ".safetensors")).write_bytes(payload)
            written.append(True)
        return out

    monkeypatch.setattr(EmbeddingCache, "_index", index_then_concurrent_writer)
    got = cache.encode(tiny_bert, texts, role="document", show_progress=False)
    assert written and len(list(ns_dir.glob("shard-*"))) == 2
    np.testing.assert_array_equal(got, expected)
    monkeypatch.setattr(EmbeddingCache, "_index", real_index)
    np.testing.assert_array_equal(cache.encode(tiny_bert, texts, role="document", show_progress=False), expected)


def test_threads_encoding_with_one_model_all_succeed_and_encode_each_text_once(tiny_bert, tmp_path):
    """Several threads of one process, one model, its three roles (one namespace each, two threads per
    namespace), texts long enough to be clipped with the tokenizer: a fast tokenizer's settings are shared
    mutable state, so unguarded threads corrupted each other's batches ("expected sequence of length ...").
    Every call succeeds, returns what the model gives, and each namespace holds each text once."""
    import threading

    from safetensors.numpy import load_file

    cache = EmbeddingCache(tmp_path, chunk_size=4)
    roles = ["query", "document", "plain"]
    texts = {(r, k): [f"{r} {k} {i} fever " + "word " * (450 if i % 2 == 0 else 2) for i in range(6)]
             for r in roles for k in range(4)}
    results, errors = [], []

    def work(n):
        role = roles[n % 3]
        try:
            for k in range(4):  # a fingerprint and an encode per call: many chances to overlap
                results.append((role, k, cache.encode(tiny_bert, texts[role, k], role=role, batch_size=4,
                                                      show_progress=False)))
        except Exception as exc:  # noqa: BLE001 - any error is the failure under test
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(results) == 24
    fn = {"query": tiny_bert.encode_query, "document": tiny_bert.encode_document, "plain": tiny_bert.encode}
    for role, k, got in results:
        np.testing.assert_allclose(got, fn[role](texts[role, k]), atol=1e-5)
    namespaces = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(namespaces) == 3
    for ns_dir in namespaces:
        rows = sum(len(load_file(str(s))["hashes"]) for s in ns_dir.glob("shard-*.safetensors"))
        assert rows == 24, ns_dir  # the other thread of a namespace waited, then found them cached


def test_a_lone_surrogate_is_one_data_error_and_nothing_is_cached(tiny_bert, tmp_path):
    """Python API callers bypass the loaders' text policy; the cache key refuses what UTF-8 cannot encode."""
    from medadapt.errors import DataError

    cache = EmbeddingCache(tmp_path)
    with pytest.raises(DataError, match=r"lone surrogate \(U\+D800 at character 4\)"):
        cache.encode(tiny_bert, ["ok", "bad\ud800"], show_progress=False)
    assert not list(tmp_path.rglob("shard-*"))
