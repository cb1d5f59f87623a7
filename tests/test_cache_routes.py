"""EmbeddingCache: the backbone fingerprint follows the weights (in-place training, edits through
``tensor.data`` as PEFT's merge does, heads left out) and asymmetric (Router) models are cached per route."""

from __future__ import annotations

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


# ---------------------------------------------------------------- fingerprint follows the weights


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


def test_edit_through_tensor_data_changes_fingerprint(tiny_bert, tmp_path):
    """``tensor.data`` edits (PEFT's unsafe merge, EMA code) bypass torch's version counter: the cache
    must still see them (it once served pre-merge embeddings for a merged LoRA document tower)."""
    cache = EmbeddingCache(tmp_path)
    before = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    fp = cache.fingerprint(tiny_bert)
    import torch

    p = tiny_bert[0].auto_model.encoder.layer[0].intermediate.dense.weight
    version = p._version
    p.data += torch.randn(p.shape, generator=torch.Generator().manual_seed(0)) * 0.5
    assert p._version == version  # invisible to a version-counter memo
    assert cache.fingerprint(tiny_bert) != fp
    after = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    assert not np.allclose(after, before, atol=1e-4)
    np.testing.assert_allclose(after, tiny_bert.encode_document(DOCS, normalize_embeddings=True), atol=1e-5)


def test_lora_train_and_merge_gets_a_new_namespace(tiny_bert, tmp_path):
    import torch

    from medadapt.recipes.base import LoraSection
    from medadapt.training.lora import attach_lora, merge_lora

    cache = EmbeddingCache(tmp_path)
    cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    fp = cache.fingerprint(tiny_bert)
    attach_lora(tiny_bert, LoraSection(r=4, alpha=8, dropout=0.0, target_modules=["query", "value"]))
    trainable = [q for q in tiny_bert.parameters() if q.requires_grad]
    for q in trainable:
        q.grad = torch.ones_like(q)
    torch.optim.SGD(trainable, lr=0.05).step()
    merge_lora(tiny_bert)
    assert cache.fingerprint(tiny_bert) != fp
    got = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    np.testing.assert_allclose(got, tiny_bert.encode_document(DOCS, normalize_embeddings=True), atol=1e-5)


def test_heads_do_not_change_the_namespace(tiny_bert, tmp_path, monkeypatch):
    import torch

    from medadapt.adapters import attach
    from medadapt.moe import MoEConfig, MoEHead

    cache = EmbeddingCache(tmp_path)
    cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    fp = cache.fingerprint(tiny_bert)
    dirs = set(tmp_path.iterdir())
    head = MoEHead(MoEConfig.single_expert(32, "mlp_gelu", zero_init_output=False))
    attach(tiny_bert, head)  # adding an embedding-level module
    with torch.no_grad():
        for q in head.parameters():
            q.add_(0.1)  # altering it in place
    calls = _count_calls(monkeypatch, EmbeddingCache, "_encode_missing")
    with_head = cache.encode(tiny_bert, DOCS, role="document", show_progress=False)
    assert cache.fingerprint(tiny_bert) == fp and not calls
    assert set(tmp_path.iterdir()) == dirs  # same namespace, nothing re-encoded
    with torch.no_grad():
        np.testing.assert_allclose(with_head, tiny_bert.encode_document(DOCS), atol=1e-5)


def test_a_new_model_reusing_an_id_is_fingerprinted_afresh(tiny_bert_dir, tmp_path):
    """Object ids are reused after garbage collection; the cache never keys anything on them."""
    import gc

    from sentence_transformers import SentenceTransformer

    cache = EmbeddingCache(tmp_path)
    seen = {}
    for seed in range(6):  # allocate-free-allocate: CPython hands the freed id to the next model
        model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
        with __import__("torch").no_grad():
            model[0].auto_model.embeddings.word_embeddings.weight.data[0, 0] = float(seed)
        seen.setdefault(id(model), set()).add(cache.fingerprint(model))
        del model
        gc.collect()
    assert sum(len(v) for v in seen.values()) == 6


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

    from medadapt.moe import MoEConfig, MoEHead

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


def test_route_views_follow_the_router(towers):
    import torch

    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache()
    view = cache.encoder_for(asym, "document")
    assert cache.encoder_for(asym, "plain") is asym
    assert cache.encoder_for(d_st, "document") is d_st
    assert all(a is b for a, b in zip(view._modules.values(), [*asym[0].sub_modules["document"], asym[1]]))
    # the document route replaced by the query tower: the query tower's namespace
    asym[0].sub_modules["document"] = torch.nn.Sequential(*asym[0].sub_modules["query"])
    assert cache.namespace(asym, "document", "") == cache.namespace(q_st, "document", "")


def test_plain_role_keys_the_whole_asym_model(towers, tmp_path):
    q_st, d_st = towers
    asym = _asym(q_st, d_st)
    cache = EmbeddingCache(tmp_path)
    got = cache.encode(asym, DOCS, show_progress=False)
    np.testing.assert_allclose(got, asym.encode(DOCS), atol=1e-5)  # default route: document
    assert cache.namespace(asym, "plain", "")[1]["model"] != cache.fingerprint(d_st)


@pytest.mark.parametrize("prompts,default", [({"cls": "classify: "}, "cls"),
                                             ({"query": "query: ", "cls": "classify: "}, "cls"),
                                             ({"document": "passage: "}, None)])
def test_cached_prompts_match_sentence_transformers(tiny_bert, tmp_path, prompts, default):
    """Per role the cache prepends what sentence-transformers' own encode_query / encode_document / encode do,
    also for a model whose only prompt is its default one (ST applies it to ``encode`` alone)."""
    tiny_bert.prompts, tiny_bert.default_prompt_name = dict(prompts), default
    cache = EmbeddingCache(tmp_path)
    for role, plain in (("query", tiny_bert.encode_query), ("document", tiny_bert.encode_document),
                        ("plain", tiny_bert.encode)):
        got = cache.encode(tiny_bert, QUERIES, role=role, show_progress=False)
        np.testing.assert_allclose(got, plain(QUERIES, normalize_embeddings=True), atol=1e-5, err_msg=role)
    without = tiny_bert.encode(QUERIES, prompt="")
    assert not np.allclose(tiny_bert.encode(QUERIES), without) or default is None  # the prompt changes the output
