"""Late-interaction (MaxSim) re-ranking: the maths against hand computation, fusion at its extremes, token vectors
cached by content (a warm cache encodes nothing, a corrupt shard is set aside), bad config one clear error, and
the same stage through ``medadapt eval --rerank maxsim`` and ``Retriever.with_reranker``."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer
from typer.testing import CliRunner

from medadapt.cache import CacheCorruptionWarning, EmbeddingCache
from medadapt.cli import app
from medadapt.data import load_beir
from medadapt.errors import ConfigError, MedAdaptWarning
from medadapt.eval import evaluate_run
from medadapt.eval.retrieval import evaluate_retrieval
from medadapt.retrieval import Retriever
from medadapt.retrieval.late import (
    MaxSimConfig,
    MaxSimReranker,
    fuse_candidates,
    maxsim,
    maxsim_scores,
    normalize_scores,
    trim_special,
)

pytestmark = pytest.mark.usefixtures("_single_thread", "_isolated_cache")

QUERY = "what causes gout"
DOCS = {"a": "gout is a painful joint disease", "b": "what causes gout in the big toe",
        "c": "glaucoma raises eye pressure", "d": "the flu spreads by coughing"}
RUN = {"q": {"a": 0.9, "b": 0.5, "c": 0.4, "d": 0.1}}


def _hand_maxsim(q: np.ndarray, d: np.ndarray) -> float:
    qn = q / np.linalg.norm(q, axis=1, keepdims=True)
    dn = d / np.linalg.norm(d, axis=1, keepdims=True)
    return float(np.mean([max(float(qi @ dj) for dj in dn) for qi in qn]))


def _reranker(model, cache_dir, **options):
    return MaxSimReranker(model, cache=EmbeddingCache(cache_dir), **options)


def _tokens(model, text, role):
    fn = model.encode_query if role == "query" else model.encode_document
    return fn([text], output_value="token_embeddings")[0].float().numpy().astype(np.float16)


# ------------------------------------------------------------------------------------------------------ maths
def test_maxsim_is_the_mean_over_query_tokens_of_the_best_cosine():
    q = np.array([[1.0, 0.0], [0.0, 2.0]])
    d1 = np.array([[3.0, 0.0], [1.0, 1.0]])    # cos: q1 -> 1.0 ; q2 -> max(0, 1/sqrt2)
    d2 = np.array([[0.0, -1.0]])               # cos: q1 -> 0 ; q2 -> -1
    assert maxsim(q, d1) == pytest.approx((1.0 + 2 ** -0.5) / 2, abs=1e-6)
    assert maxsim(q, d2) == pytest.approx(-0.5, abs=1e-6)
    rng = np.random.default_rng(0)
    q, docs = rng.normal(size=(5, 8)), [rng.normal(size=(n, 8)) for n in (1, 7, 3)]
    np.testing.assert_allclose(maxsim_scores(q, docs), [_hand_maxsim(q, d) for d in docs], atol=1e-6)


def test_normalizations_and_special_tokens():
    x = np.array([1.0, 2.0, 4.0])
    np.testing.assert_allclose(normalize_scores(x, "zscore"), (x - x.mean()) / (x.std() + 1e-9))
    np.testing.assert_allclose(normalize_scores(x, "minmax"), [0.0, 1 / 3, 1.0], atol=1e-8)
    t = np.arange(8.0).reshape(4, 2)
    np.testing.assert_array_equal(trim_special(t, False), t[1:3])
    np.testing.assert_array_equal(trim_special(t, True), t)
    np.testing.assert_array_equal(trim_special(t[:2], False), t[:2])  # two tokens: kept


def test_fusion_weight_zero_keeps_the_first_stage_and_one_follows_the_late_scores():
    first, late = np.array([3.0, 2.0, 1.0]), np.array([0.1, 0.9, 0.5])
    assert fuse_candidates(first, late, 0.0, "zscore")[0].tolist() == [0, 1, 2]
    assert fuse_candidates(first, late, 1.0, "zscore")[0].tolist() == [1, 2, 0]
    # w = 0.5: z-score and min-max disagree on these numbers (hand computed)
    first, late = np.array([10.0, 9.0, 0.0]), np.array([0.0, 0.3, 1.0])
    z = 0.5 * normalize_scores(first, "zscore") + 0.5 * normalize_scores(late, "zscore")
    m = 0.5 * normalize_scores(first, "minmax") + 0.5 * normalize_scores(late, "minmax")
    assert fuse_candidates(first, late, 0.5, "zscore")[0].tolist() == np.argsort(-z).tolist() == [1, 2, 0]
    assert fuse_candidates(first, late, 0.5, "minmax")[0].tolist() == np.argsort(-m).tolist() == [1, 0, 2]


# --------------------------------------------------------------------------------------------- the reranker
def test_weight_one_orders_by_maxsim_of_the_models_own_token_vectors(tiny_bert, tmp_path):
    r = _reranker(tiny_bert, tmp_path / "c", weight=1.0)
    out = r.rerank({"q": QUERY}, RUN, DOCS)["q"]
    q = _tokens(tiny_bert, QUERY, "query")
    hand = {d: _hand_maxsim(q.astype(np.float32), _tokens(tiny_bert, t, "document").astype(np.float32))
            for d, t in DOCS.items()}
    assert list(out) == sorted(hand, key=lambda d: -hand[d])
    z = normalize_scores(np.array([hand[d] for d in RUN["q"]]), "zscore")
    np.testing.assert_allclose([out[d] for d in RUN["q"]], z, atol=1e-4)


def test_special_tokens_false_drops_first_and_last_token(tiny_bert, tmp_path):
    r = _reranker(tiny_bert, tmp_path / "c", weight=1.0, special_tokens=False)
    q = _tokens(tiny_bert, QUERY, "query").astype(np.float32)[1:-1]
    d = _tokens(tiny_bert, DOCS["b"], "document").astype(np.float32)[1:-1]
    assert r.scores(QUERY, [DOCS["b"]])[0] == pytest.approx(_hand_maxsim(q, d), abs=1e-5)
    kept = _reranker(tiny_bert, tmp_path / "c", weight=1.0).scores(QUERY, [DOCS["b"]])[0]
    assert abs(kept - _hand_maxsim(q, d)) > 1e-4


def test_weight_zero_keeps_the_run_order_and_encodes_nothing(tiny_bert, tmp_path):
    r = _reranker(tiny_bert, tmp_path / "c", weight=0.0)
    out = r.rerank({"q": QUERY}, RUN, DOCS)["q"]
    assert list(out) == list(RUN["q"])
    assert r.tokens.encode_calls == 0


def test_depth_reranks_the_head_and_keeps_the_tail_below_in_order(tiny_bert, tmp_path):
    r = _reranker(tiny_bert, tmp_path / "c", weight=1.0, depth=2)
    out = r.rerank({"q": QUERY}, RUN, {"a": DOCS["a"], "b": DOCS["b"]})["q"]  # the tail needs no text
    assert set(list(out)[:2]) == {"a", "b"} and list(out)[2:] == ["c", "d"]
    assert out["c"] > out["d"] and min(out["a"], out["b"]) > out["c"]


def test_a_warm_cache_gives_identical_scores_with_zero_encodes(tiny_bert, tmp_path):
    first = _reranker(tiny_bert, tmp_path / "c", weight=0.7)
    a = first.rerank({"q": QUERY}, RUN, DOCS)
    assert first.tokens.encode_calls == 2  # the query, then every candidate in one call
    again = _reranker(tiny_bert, tmp_path / "c", weight=0.7)  # a new process' view: read from disk
    assert again.rerank({"q": QUERY}, RUN, DOCS) == a
    assert again.tokens.encode_calls == 0
    tiny_bert[0].auto_model.embeddings.word_embeddings.weight.data.mul_(2.0)  # other weights: another namespace
    changed = _reranker(tiny_bert, tmp_path / "c", weight=0.7)
    changed.rerank({"q": QUERY}, RUN, DOCS)
    assert changed.tokens.encode_calls == 2


def test_a_corrupt_shard_is_detected_set_aside_and_re_encoded(tiny_bert, tmp_path):
    good = _reranker(tiny_bert, tmp_path / "c", weight=1.0).rerank({"q": QUERY}, RUN, DOCS)
    shards = sorted((tmp_path / "c").glob("*/shard-*.safetensors"))
    assert len(shards) == 2
    for shard in shards:  # flip bytes in the token payload (the end of the file)
        data = bytearray(shard.read_bytes())
        data[-40:-8] = bytes(b ^ 0x5A for b in data[-40:-8])
        shard.write_bytes(bytes(data))
    r = _reranker(tiny_bert, tmp_path / "c", weight=1.0)
    with pytest.warns(CacheCorruptionWarning, match="checksum differs"):
        again = r.rerank({"q": QUERY}, RUN, DOCS)
    assert again == good and r.tokens.encode_calls == 2
    assert len(list((tmp_path / "c").glob("*/corrupt-shard-*"))) == 2


@pytest.mark.parametrize("options, message", [
    ({"weight": 1.5}, "weight: Input should be less than or equal to 1"),
    ({"weight": -0.1}, "weight: Input should be greater than or equal to 0"),
    ({"depth": 0}, "depth: Input should be greater than or equal to 1"),
    ({"normalization": "softmax"}, "normalization: Input should be 'zscore' or 'minmax'"),
])
def test_bad_config_is_one_config_error(tiny_bert, options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        MaxSimReranker(tiny_bert, **options)
    with pytest.raises(ConfigError):
        MaxSimConfig.of(**options)


# ------------------------------------------------------------------------------------------- eval and serving
def _eval(*args):
    result = CliRunner().invoke(app, ["eval", *map(str, args), "--metrics", "ndcg@10,mrr@10,recall@10", "-q"])
    return result, [ln for ln in result.output.splitlines() if ln.strip()]


def test_cli_rerank_weight_zero_equals_no_rerank_and_weight_one_is_maxsim(tiny_bert_dir, tiny_beir_dir, tmp_path):
    common = ["--model", tiny_bert_dir, "--data", tiny_beir_dir, "--split", "test", "--cache-dir", tmp_path / "c"]
    for name, extra in (("plain", []), ("w0", ["--rerank", "maxsim", "--rerank-weight", "0"]),
                        ("w1", ["--rerank", "maxsim", "--rerank-weight", "1", "--rerank-depth", "5"])):
        result, _ = _eval(*common, *extra, "--output", tmp_path / f"{name}.json")
        assert result.exit_code == 0, result.output
    scores = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in ("plain", "w0", "w1")}
    assert scores["w0"] == scores["plain"]
    # by hand: the dense run, its top 5 re-ordered by MaxSim of the model's token vectors
    model = SentenceTransformer(str(tiny_bert_dir), device="cpu")
    data = load_beir(tiny_beir_dir, ["test"])
    metrics = ["ndcg@10", "mrr@10", "recall@10"]
    _, run = evaluate_retrieval(model, data, "test", metrics, cache=EmbeddingCache(tmp_path / "c2"),
                                show_progress=False, return_run=True)
    queries = data.split_queries("test")
    hand = {}
    for qid, hits in run.items():
        ranked = sorted(hits, key=lambda d: -hits[d])
        head, tail = ranked[:5], ranked[5:]
        q = _tokens(model, queries[qid], "query").astype(np.float32)
        late = {d: _hand_maxsim(q, _tokens(model, data.doc_text(d), "document").astype(np.float32)) for d in head}
        order = sorted(head, key=lambda d: -late[d])
        hand[qid] = {d: 100.0 - i for i, d in enumerate(order + tail)}
    expected = evaluate_run(data.qrels["test"], hand, metrics)
    assert scores["w1"] == pytest.approx(expected, abs=1e-4)
    assert scores["w1"] != scores["plain"]


@pytest.mark.parametrize("extra, message", [
    (["--rerank", "maxsim", "--rerank-weight", "2"], "weight: Input should be less than or equal to 1"),
    (["--rerank-weight", "0.5"], "--rerank-weight / --rerank-depth apply with --rerank maxsim"),
    (["--rerank", "maxsim", "--task", "sts"], "--task sts does not take it"),
])
def test_cli_bad_rerank_options_are_one_error_line(tiny_bert_dir, tiny_beir_dir, tmp_path, extra, message):
    result, lines = _eval("--model", tiny_bert_dir, "--data", tiny_beir_dir, "--cache-dir", tmp_path / "c", *extra)
    assert result.exit_code != 0
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], lines


def test_cli_rerank_of_an_index_uses_its_own_model(tiny_bert_dir, tiny_beir_dir, tmp_path):
    for kind in ("hybrid", "lexical"):
        result = CliRunner().invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / kind),
                                          "--kind", kind, "--model", str(tiny_bert_dir), "-q"])
        assert result.exit_code == 0, result.output
    index = ["--index", tmp_path / "hybrid", "--data", tiny_beir_dir, "--cache-dir", tmp_path / "c"]
    for name, extra in (("plain", []), ("w0", ["--rerank", "maxsim", "--rerank-weight", "0"]),
                        ("w1", ["--rerank", "maxsim", "--rerank-weight", "1"])):
        result, _ = _eval(*index, *extra, "--output", tmp_path / f"{name}.json")
        assert result.exit_code == 0, result.output
    scores = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in ("plain", "w0", "w1")}
    assert scores["w0"] == scores["plain"] != scores["w1"]
    result, lines = _eval("--index", tmp_path / "lexical", "--data", tiny_beir_dir, "--rerank", "maxsim")
    assert result.exit_code != 0 and len(lines) == 1
    assert lines[0].startswith("error: re-ranking an index needs its sentence-transformers model"), lines


def test_cli_rerank_of_an_index_of_another_corpus_reads_the_indexs_texts(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.retrieval import Documents

    data = load_beir(tiny_beir_dir, ["test"])
    ids = [*data.doc_ids, "extra"]
    texts = [data.corpus[d]["text"] for d in data.doc_ids] + [" ".join(data.split_queries("test").values())]
    Retriever.build(Documents(ids, texts, [data.corpus[d].get("title", "") for d in data.doc_ids] + [""]),
                    str(tiny_bert_dir), kind="dense", cache=EmbeddingCache(tmp_path / "c"),
                    show_progress=False).save(tmp_path / "idx")
    with pytest.warns(MedAdaptWarning, match="another corpus"):
        result = CliRunner().invoke(app, ["eval", "--index", str(tmp_path / "idx"), "--data", str(tiny_beir_dir),
                                          "--cache-dir", str(tmp_path / "c"), "--rerank", "maxsim", "-q"])
    assert result.exit_code == 0, result.output


def test_retriever_with_reranker_serves_the_maxsim_order(tiny_bert, tmp_path):
    from medadapt.retrieval import Documents

    docs = Documents(list(DOCS), list(DOCS.values()), [""] * len(DOCS))
    plain = Retriever.build(docs, tiny_bert, kind="dense", cache=EmbeddingCache(tmp_path / "c"),
                            show_progress=False)
    reranked = plain.with_reranker(MaxSimReranker(tiny_bert, weight=1.0, cache=EmbeddingCache(tmp_path / "c")))
    q = _tokens(tiny_bert, QUERY, "query").astype(np.float32)
    hand = {d: _hand_maxsim(q, _tokens(tiny_bert, t, "document").astype(np.float32)) for d, t in DOCS.items()}
    res = reranked.search(QUERY, k=3)
    assert res.ids == sorted(hand, key=lambda d: -hand[d])[:3]
    assert res.texts == [DOCS[d] for d in res.ids]
    assert plain.reranker is None and len(plain.search(QUERY, k=4)) == 4  # the original is unchanged
    built = plain.with_reranker(weight=1.0, depth=4)  # options alone: over the index's own model
    assert built.search(QUERY, k=3).ids == res.ids
    pytest.importorskip("langchain_core")
    from medadapt.retrieval import MedAdaptRetriever

    lc = MedAdaptRetriever(retriever=reranked, k=3)
    assert [d.metadata["id"] for d in lc.invoke(QUERY)] == res.ids


def test_a_router_model_uses_the_query_route_for_queries_and_the_document_route_for_documents(tmp_path):
    from sentence_transformers.base.modules import Normalize, Router

    from medadapt.tiny import build_tiny_bert

    q_st, d_st = (SentenceTransformer(str(build_tiny_bert(tmp_path / f"t{seed}", seed=seed)), device="cpu")
                  for seed in (1, 2))
    router = Router.for_query_document(query_modules=list(q_st._modules.values())[:-1],
                                       document_modules=list(d_st._modules.values())[:-1])
    asym = SentenceTransformer(modules=[router, Normalize()], device="cpu")
    r = _reranker(asym, tmp_path / "c", weight=1.0)
    q = _tokens(q_st, QUERY, "query").astype(np.float32)
    docs = [DOCS["a"], DOCS["c"]]
    hand = [_hand_maxsim(q, _tokens(d_st, t, "document").astype(np.float32)) for t in docs]
    np.testing.assert_allclose(r.scores(QUERY, docs), hand, atol=1e-5)
    swapped = [_hand_maxsim(_tokens(d_st, QUERY, "query").astype(np.float32),
                            _tokens(q_st, t, "document").astype(np.float32)) for t in docs]
    assert not np.allclose(hand, swapped, atol=1e-3)


def test_cli_search_rerank_serves_the_retrievers_reranked_run(tiny_bert_dir, tiny_beir_dir, tmp_path):
    result = CliRunner().invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / "idx"),
                                      "--model", str(tiny_bert_dir), "-q"])
    assert result.exit_code == 0, result.output
    search = ["search", "--index", str(tmp_path / "idx"), "--queries", str(tiny_beir_dir), "--split", "test",
              "-k", "3", "-q"]
    plain = CliRunner().invoke(app, search)
    result = CliRunner().invoke(app, [*search, "--rerank", "maxsim", "--rerank-weight", "1"])
    assert plain.exit_code == 0 and result.exit_code == 0, result.output
    got = [ln.split()[:3] for ln in result.output.splitlines() if ln.strip()]
    data = load_beir(tiny_beir_dir, ["test"])
    queries = data.split_queries("test")
    r = Retriever.load(tmp_path / "idx").with_reranker(weight=1.0)
    expected = [[q, "Q0", hit.id] for q, res in zip(queries, r.batch_search(list(queries.values()), 3)) for hit in res]
    assert got == expected and result.output != plain.output
    bad = CliRunner().invoke(app, [*search, "--rerank", "maxsim", "--rerank-depth", "0"])
    lines = [ln for ln in bad.output.splitlines() if ln.strip()]
    assert bad.exit_code != 0 and len(lines) == 1
    assert lines[0] == "error: maxsim re-ranking: depth: Input should be greater than or equal to 1"
