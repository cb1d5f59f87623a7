"""EmbeddingCache: fingerprint memo validity (in-place training, heads, garbage collection) and per-route
caching of asymmetric (Router) models."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from medadapt.cache import EmbeddingCache

pytestmark = pytest.mark.usefixtures("_single_thread")

DOCS = [f"{name} is a condition with symptoms number {i}"
        for i, name in enumerate(["gout", "asthma", "anemia"])]
QUERIES = ["symptoms of gout", "asthma inhaler", "what is anemia"]


def _count_calls(monkeypatch, obj, name):
    calls = []
    real = getattr(obj, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(obj, name, counting)
    return calls


# ---------------------------------------------------------------- fingerprint memo


def test_in_place_backbone_update_is_not_served_stale(tiny_bert, tmp_path):
    import torch

    cache = EmbeddingCache(tmp_path)
    before = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    fp_before = cache.fingerprint(tiny_bert)
    p = tiny_bert[0].auto_model.encoder.layer[0].intermediate.dense.bias  # (a weight: its inputs sum to 0)
    with torch.no_grad():
        p.add_(0.1)  # same model object, trained in place (e.g. after hard-negative mining)
    after = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    direct = tiny_bert.encode_document(DOCS, normalize_embeddings=True)
    assert not np.allclose(after, before, atol=1e-4)
    np.testing.assert_allclose(after, direct, atol=1e-5)
    assert cache.fingerprint(tiny_bert) != fp_before
    assert len(list(tmp_path.glob("*/meta.json"))) == 2


def test_optimizer_step_changes_fingerprint(tiny_bert, tmp_path):
    import torch

    cache = EmbeddingCache(tmp_path)
    fp = cache.fingerprint(tiny_bert)
    params = list(tiny_bert[0].parameters())
    for q in params:
        q.grad = torch.ones_like(q)
    torch.optim.SGD(params, lr=0.01).step()
    assert cache.fingerprint(tiny_bert) != fp


def test_memo_reused_while_unchanged_and_across_head_changes(tiny_bert, tmp_path, monkeypatch):
    import torch

    import medadapt.models
    from medadapt.heads import MoEConfig, MoEHead, attach

    cache = EmbeddingCache(tmp_path)
    cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    fp = cache.fingerprint(tiny_bert)
    dirs = set(tmp_path.iterdir())
    hashes = _count_calls(monkeypatch, medadapt.models, "modules_fingerprint")
    assert cache.fingerprint(tiny_bert) == fp and not hashes  # cheap: no weight hashing when nothing changed

    head = MoEHead(MoEConfig.single_expert(32, "mlp_gelu", zero_init_output=False))
    attach(tiny_bert, head)  # adding an embedding-level module
    assert cache.fingerprint(tiny_bert) == fp
    with torch.no_grad():
        for q in head.parameters():
            q.add_(0.1)  # altering it in place
    with_head = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    assert cache.fingerprint(tiny_bert) == fp and not hashes
    assert set(tmp_path.iterdir()) == dirs  # same namespace, nothing re-encoded
    with torch.no_grad():
        np.testing.assert_allclose(with_head, tiny_bert.encode_document(DOCS), atol=1e-5)


def test_memo_entries_die_with_their_model(tiny_bert_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    cache = EmbeddingCache(tmp_path)
    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    cache.fingerprint(model)
    assert len(cache._fingerprints) == 1
    del model
    gc.collect()
    assert len(cache._fingerprints) == 0  # a new object reusing the id cannot inherit the fingerprint


def test_identity_memo_checks_the_live_object():
    from medadapt.cache import _IdentityMemo

    class Obj:
        pass

    memo = _IdentityMemo()
    a = Obj()
    memo.set(a, "a")
    assert memo.get(a) == "a"
    # an entry whose weak reference points elsewhere (what an id reused after gc would look like) is ignored
    b = Obj()
    memo._entries[id(b)] = memo._entries[id(a)]
    assert memo.get(b) is None
    memo.pop(a)
    assert memo.get(a) is None


# ---------------------------------------------------------------- asymmetric models


@pytest.fixture(scope="module")
def tower_dirs(tmp_path_factory):
    from conftest import build_tiny_bert

    return (build_tiny_bert(tmp_path_factory.mktemp("q_tower"), seed=1),
            build_tiny_bert(tmp_path_factory.mktemp("d_tower"), seed=2))


@pytest.fixture()
def towers(tower_dirs):
    from sentence_transformers import SentenceTransformer

    return tuple(SentenceTransformer(str(d), device="cpu") for d in tower_dirs)


def _asym(q_st, d_st, prompts=None):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Router

    router = Router.for_query_document(query_modules=list(q_st._modules.values())[:-1],
                                       document_modules=list(d_st._modules.values())[:-1])
    return SentenceTransformer(modules=[router, Normalize()], device="cpu", prompts=prompts)


def test_asym_document_route_shares_the_standalone_towers_cache(towers, tmp_path, monkeypatch):
    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache(tmp_path)
    standalone = cache.encode(d_st, DOCS, role="document", show_progress=False)
    assert cache.count_missing(asym, DOCS, role="document") == 0
    calls = _count_calls(monkeypatch, EmbeddingCache, "_encode_missing")
    got = cache.encode(asym, DOCS, role="document", show_progress=False)
    assert not calls  # nothing encoded again
    np.testing.assert_array_equal(got, standalone)
    np.testing.assert_allclose(got, asym.encode_document(DOCS, normalize_embeddings=False), atol=1e-5)
    assert cache.namespace(asym, "document", "") == cache.namespace(d_st, "document", "")
    assert len(list(tmp_path.glob("*/meta.json"))) == 1


def test_asym_query_route_and_fresh_cache(towers, tmp_path, monkeypatch):
    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache(tmp_path)
    calls = _count_calls(monkeypatch, EmbeddingCache, "_encode_missing")
    q = cache.encode(asym, QUERIES, role="query", show_progress=False)  # encoded through the asym model first
    d = cache.encode(asym, DOCS, role="document", show_progress=False)
    assert len(calls) == 2
    np.testing.assert_allclose(q, asym.encode_query(QUERIES, normalize_embeddings=False), atol=1e-5)
    np.testing.assert_allclose(d, asym.encode_document(DOCS, normalize_embeddings=False), atol=1e-5)
    # the standalone towers now hit the entries the asymmetric model wrote
    np.testing.assert_array_equal(cache.encode(q_st, QUERIES, role="query", show_progress=False), q)
    np.testing.assert_array_equal(cache.encode(d_st, DOCS, role="document", show_progress=False), d)
    assert len(calls) == 2
    assert cache.count_missing(q_st, QUERIES, role="query") == 0
    assert not np.allclose(cache.encode(asym, QUERIES, role="document", show_progress=False), q, atol=1e-3)
    # raw (pre-Normalize) output of the route
    raw = cache.encode(asym, QUERIES, role="query", normalize=False, show_progress=False)
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), q, atol=1e-5)


def test_asym_prompts_follow_the_role(towers, tmp_path):
    q_st, d_st = towers
    asym = _asym(q_st, d_st, prompts={"query": "query: ", "document": "passage: "})
    cache = EmbeddingCache(tmp_path)
    q = cache.encode(asym, QUERIES, role="query", show_progress=False)
    d = cache.encode(asym, DOCS, role="document", show_progress=False)
    np.testing.assert_allclose(q, asym.encode_query(QUERIES), atol=1e-5)
    np.testing.assert_allclose(d, asym.encode_document(DOCS), atol=1e-5)
    assert cache.count_missing(q_st, QUERIES, role="query", prompt="query: ") == 0
    assert cache.count_missing(d_st, DOCS, role="document", prompt="passage: ") == 0
    assert cache.count_missing(q_st, QUERIES, role="query") == len(QUERIES)


def test_head_on_query_route_keeps_the_towers_namespace(towers, tmp_path, monkeypatch):
    import torch

    from medadapt.heads import MoEConfig, MoEHead

    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache(tmp_path)
    cache.encode(q_st, QUERIES, role="query", show_progress=False)
    head = MoEHead(MoEConfig.single_expert(32, "mlp_gelu", zero_init_output=False))
    asym[0].sub_modules["query"].append(head)
    calls = _count_calls(monkeypatch, EmbeddingCache, "_encode_missing")
    got = cache.encode(asym, QUERIES, role="query", show_progress=False)
    assert not calls
    with torch.no_grad():
        np.testing.assert_allclose(got, asym.encode_query(QUERIES, normalize_embeddings=False), atol=1e-5)
    assert not np.allclose(got, cache.encode(q_st, QUERIES, role="query", show_progress=False), atol=1e-3)


def test_route_views_are_memoised_and_rebuilt_on_change(towers, tmp_path, monkeypatch):
    import torch

    import medadapt.models

    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache(tmp_path)
    view = cache.encoder_for(asym, "document")
    assert cache.encoder_for(asym, "document") is view
    assert cache.encoder_for(asym, "plain") is asym
    assert cache.encoder_for(d_st, "document") is d_st
    assert all(a is b for a, b in zip(view._modules.values(), [*asym[0].sub_modules["document"], asym[1]]))
    cache.encode(asym, DOCS, role="document", show_progress=False)
    hashes = _count_calls(monkeypatch, medadapt.models, "modules_fingerprint")
    cache.encode(asym, DOCS, role="document", show_progress=False)
    assert not hashes  # view and fingerprint both memoised

    # the document route replaced by the query tower: a new view, the query tower's namespace
    asym[0].sub_modules["document"] = torch.nn.Sequential(*asym[0].sub_modules["query"])
    assert cache.encoder_for(asym, "document") is not view
    assert cache.namespace(asym, "document", "") == cache.namespace(q_st, "document", "")

    asym_id = id(asym)
    del asym, view
    gc.collect()
    assert asym_id not in cache._views._entries


def test_plain_role_keys_the_whole_asym_model(towers, tmp_path):
    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache(tmp_path)
    got = cache.encode(asym, DOCS, show_progress=False)
    np.testing.assert_allclose(got, asym.encode(DOCS), atol=1e-5)  # default route: document
    assert cache.namespace(asym, "plain", "")[1]["model"] != cache.fingerprint(d_st)
