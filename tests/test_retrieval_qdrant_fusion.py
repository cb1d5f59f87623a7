"""Qdrant-side hybrid search (medadapt.retrieval.vectordb): BM25 stored as Qdrant sparse vectors with the IDF
modifier for any dense model, and hybrid queries fused by Qdrant's Query API (prefetch + RRF / DBSF), checked
against medadapt's in-process Retriever on small corpora, in Qdrant's embedded mode (no server)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("qdrant_client")
from _helpers import tiny_docs  # noqa: E402
from qdrant_client import QdrantClient, models  # noqa: E402

import medadapt  # noqa: E402
from medadapt.errors import MedAdaptError  # noqa: E402
from medadapt.hyrec.model import HyReCConfig, HyReCModel  # noqa: E402
from medadapt.retrieval import Documents, IndexMismatchError, Retriever, RetrieverConfig  # noqa: E402
from medadapt.retrieval.fusion import rrf_fusion  # noqa: E402
from medadapt.retrieval.vectordb import BM25_META, QdrantRetriever, export_to_qdrant  # noqa: E402

pytestmark = pytest.mark.usefixtures("_isolated_cache")


QUERIES = ["asthma inhaler wheezing", "uric acid toe", "sleep at night", "blood sugar insulin", "condition symptoms"]


class DenseToy:
    """A dense toy model without score ties (fixed random word vectors); BM25 goes with it."""

    encoder_tag = "toy"
    similarity_fn_name = "dot"
    vocab = ["gout", "toe", "asthma", "wheezing", "sugar", "insulin", "pain", "night"]
    _words = np.random.default_rng(0).normal(size=(8, 8)).astype(np.float32)

    def encoder_identity(self):
        return {"fingerprint": type(self).__name__, "similarity": "dot"}

    def _dense(self, texts):
        return np.array([sum((t.count(w) * self._words[i] for i, w in enumerate(self.vocab)), 0.01 * len(t)
                             * self._words[7]) for t in texts], dtype=np.float32)

    def encode_query(self, texts, *, batch_size=64):
        return self._dense(texts)

    def encode_document(self, texts, *, batch_size=64, show_progress=False):
        return self._dense(texts)


class WeightedToy(DenseToy):
    """The same with a learned-lexical branch: length-scaled term weights, without score ties."""

    @property
    def n_terms(self) -> int:
        return len(self.vocab)

    def encode_lexical(self, texts, role="document", *, batch_size=32, show_progress=False):
        return [{i: (1 + i) * t.count(w) / (len(t) if role == "document" else 1.0) for i, w in enumerate(self.vocab)
                 if w in t} for t in texts]


TOY_DOCS = Documents([f"t{i}" for i in range(10)], [
    "gout pain in the big toe at night", "asthma and wheezing", "insulin lowers blood sugar", "toe pain",
    "night wheezing in asthma", "sugar and insulin at night", "gout", "pain at night, pain all day",
    "asthma inhaler", "sugar"])
TOY_QUERIES = ["gout toe pain", "asthma wheezing night", "insulin sugar", "pain night"]


def _no_ties(values) -> bool:
    return len(set(np.round(values, 6))) == len(values)


def _pair(model, docs, cfg, **kw):
    client = QdrantClient(":memory:")
    export_to_qdrant(client, "c", docs, model, config=cfg, model_name="m")
    return (client, QdrantRetriever(client, "c", model=model, **kw),
            Retriever.build(docs, model, config=cfg, model_name="m", show_progress=False))


def test_bm25_is_stored_as_idf_sparse_vectors_and_scores_as_the_in_process_bm25(tiny_bert, tmp_path):
    docs = tiny_docs()
    cfg = RetrieverConfig(kind="lexical")
    client = QdrantClient(path=str(tmp_path / "db"))
    export_to_qdrant(client, "bm25", docs, tiny_bert, config=cfg, model_name="tiny")
    info = client.get_collection("bm25")
    assert info.config.params.sparse_vectors["sparse"].modifier == models.Modifier.IDF
    assert info.config.params.vectors == {}  # lexical only: no dense vectors
    meta = info.config.metadata
    assert meta[BM25_META]["k1"] == 1.5 and meta[BM25_META]["b"] == 0.75 and "asthma" in meta[BM25_META]["terms"]
    assert meta["medadapt"]["build"]["sparse_weights"] == "bm25"
    # a document's stored values are saturated term frequencies in (0, 1): the IDF is Qdrant's
    values = client.retrieve("bm25", [0], with_vectors=True)[0].vector["sparse"].values
    assert values and all(0 < v < 1 for v in values)
    client.close()
    client = QdrantClient(path=str(tmp_path / "db"))
    q = QdrantRetriever(client, "bm25", model=tiny_bert)  # reopened: the vocabulary comes from the metadata
    ref = Retriever.build(docs, tiny_bert, config=cfg, show_progress=False)
    assert ref.lexical.kind == "bm25"
    for a, b in zip(q.batch_search(QUERIES, 10), ref.batch_search(QUERIES, 10)):
        assert a.ids == b.ids[:len(a.ids)] and len(a.ids) == len(b.ids) > 0
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5)
    assert q.search("zebra xylophone", 5).ids == []  # no known term: nothing, as in-process
    client.close()


@pytest.mark.parametrize("method", ["minmax", "zscore", "rrf", "sum"])
def test_dense_model_with_bm25_client_side_fusion_equals_the_retriever(tiny_bert, method):
    cfg = RetrieverConfig(kind="hybrid", fusion={"method": method, "dense_weight": 0.7})
    _, q, r = _pair(tiny_bert, tiny_docs(), cfg)
    for a, b in zip(q.batch_search(QUERIES, 10), r.batch_search(QUERIES, 10)):
        assert a.ids == b.ids
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("case", ["dense+bm25", "learned"])
def test_server_side_rrf_reproduces_the_in_process_rrf_top10(tiny_bert, case):
    model, docs, queries = (tiny_bert, tiny_docs(), QUERIES) if case == "dense+bm25" else (
        WeightedToy(), TOY_DOCS, TOY_QUERIES)
    cfg = RetrieverConfig(kind="hybrid", fusion={"method": "rrf", "rrf_k": 60})
    _, server, inproc = _pair(model, docs, cfg, server_fusion="rrf")
    client_side = QdrantRetriever(server.client, "c", model=model)
    checked = 0
    for query in queries:
        dense, sparse = (client_side._query(using, vec, 100)[0] for using, vec in
                         (("dense", [v.tolist() for v in client_side._dense_queries([query])]),
                          ("sparse", client_side._sparse_queries([query]))))
        if not (_no_ties([p.score for p in dense]) and _no_ties([p.score for p in sparse])):
            continue  # Qdrant orders equal scores its own way: the definitions agree on tie-free lists
        checked += 1
        a, b = server.search(query, 10), inproc.search(query, 10)
        assert a.ids == b.ids == client_side.search(query, 10).ids
        # Rrf(k = rrf_k + 1) over positions from 0 gives medadapt's 1 / (rrf_k + rank) exactly
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9)
    assert checked >= 3


def test_a_hyrec_model_served_from_qdrant_fuses_server_side_as_in_process(tiny_bert_dir, tmp_path):
    """A real (tiny, random) HyReC folder, loaded as users load it: its learned term weights are the Qdrant
    sparse vectors, and Qdrant's own RRF gives the in-process RRF ranking and scores where no list ties."""
    torch.manual_seed(0)
    cfg = HyReCConfig(branch_layers=1, language="en", pooling="mean", n_word_buckets=1000, query_max_length=16,
                      passage_max_length=32)
    HyReCModel.from_backbone(str(tiny_bert_dir), cfg).save(tmp_path / "hyrec")
    model = medadapt.load(tmp_path / "hyrec")
    docs = tiny_docs()
    _, server, inproc = _pair(model, docs, RetrieverConfig(kind="hybrid", fusion={"method": "rrf", "rrf_k": 60}),
                              server_fusion="rrf")
    assert inproc.learned_sparse and server.client.get_collection("c").config.metadata["medadapt"]["build"][
        "sparse_weights"] != "bm25"
    client_side = QdrantRetriever(server.client, "c", model=model)
    checked = 0
    for query in QUERIES:
        dense, sparse = (client_side._query(using, vec, 100)[0] for using, vec in
                         (("dense", [v.tolist() for v in client_side._dense_queries([query])]),
                          ("sparse", client_side._sparse_queries([query]))))
        if not sparse or not (_no_ties([p.score for p in dense]) and _no_ties([p.score for p in sparse])):
            continue
        checked += 1
        a, b = server.search(query, 10), inproc.search(query, 10)
        assert a.ids == b.ids
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-9)
    assert checked >= 2, checked


def test_rrf_constant_qdrant_default_is_not_medadapts(tiny_bert):
    """Qdrant's default RRF (k = 2 over positions from 0) is medadapt's formula with rrf_k = 1, not 60."""
    cfg = RetrieverConfig(kind="hybrid", fusion={"method": "rrf"})
    client, server, _ = _pair(tiny_bert, tiny_docs(), cfg, server_fusion="rrf")
    dq = server._dense_queries(QUERIES)
    sq = server._sparse_queries(QUERIES)
    differ = checked = 0
    for d, s, query in zip(dq, sq, QUERIES):
        default = client.query_points("c", prefetch=[models.Prefetch(query=d.tolist(), using="dense", limit=100),
                                                     models.Prefetch(query=s, using="sparse", limit=100)],
                                      query=models.FusionQuery(fusion=models.Fusion.RRF), limit=10).points
        lists = [{f"{p.id:04d}": p.score for p in server._query(u, [v], 100)[0]} for u, v in (("dense", d.tolist()),
                                                                                               ("sparse", s))]
        if not all(_no_ties(list(x.values())) for x in lists):
            continue
        checked += 1
        as_k1 = rrf_fusion(lists, k_rrf=1, k=10)
        np.testing.assert_allclose(sorted((p.score for p in default), reverse=True), list(as_k1.values()),
                                   rtol=1e-9)
        ours = [int(i) for i in rrf_fusion(lists, k_rrf=60, k=10)]
        differ += [int(p.id) for p in default] != ours
    assert checked >= 3 and differ >= 1  # the constant changes rankings: hence Rrf(k=rrf_k + 1) in server_fusion="rrf"


def test_server_side_dbsf_is_qdrants_distribution_based_fusion(tiny_bert):
    cfg = RetrieverConfig(kind="hybrid", fusion={"method": "rrf", "depth": 30})  # whole lists: no cut among ties
    _, server, _ = _pair(tiny_bert, tiny_docs(), cfg, server_fusion="dbsf")
    for query in QUERIES:
        fused: dict[int, float] = {}
        for using, vec in (("dense", server._dense_queries([query])[0].tolist()),
                           ("sparse", server._sparse_queries([query])[0])):
            points = server._query(using, [vec], 30)[0]
            x = np.array([p.score for p in points], dtype=np.float64)
            sd = x.std(ddof=1) if len(x) > 1 else 0.0
            for p, v in zip(points, x):  # (score - (mean - 3 sd)) / 6 sd (0.5 for one hit), summed over the lists
                fused[int(p.id)] = fused.get(int(p.id), 0.0) + ((v - x.mean() + 3 * sd) / (6 * sd) if sd else 0.5)
        want = sorted(fused, key=lambda i: (-fused[i], i))[:10]
        got = server.search(query, 10)
        assert got.ids == [server.client.retrieve("c", [i])[0].payload["doc_id"] for i in want]
        np.testing.assert_allclose(got.scores, [fused[i] for i in want], rtol=1e-5)
        assert got.texts[0] and got.ids[0]  # payload filled in


def test_server_fusion_is_refused_where_it_cannot_apply(tiny_bert):
    client = QdrantClient(":memory:")
    export_to_qdrant(client, "dense", tiny_docs(), tiny_bert, model_name="tiny")
    with pytest.raises(MedAdaptError, match="server_fusion needs a hybrid collection; Qdrant collection 'dense' is dense"):
        QdrantRetriever(client, "dense", model=tiny_bert, server_fusion="rrf")
    with pytest.raises(MedAdaptError, match="server_fusion must be one of rrf, dbsf, got 'minmax'"):
        QdrantRetriever(client, "dense", model=tiny_bert, server_fusion="minmax")
    # a learned-sparse collection is not silently refilled with BM25 (or the reverse)
    export_to_qdrant(client, "learned", TOY_DOCS, WeightedToy(), kind="hybrid", model_name="toy")
    before = client.get_collection("learned").points_count
    with pytest.raises(IndexMismatchError, match="holds learned sparse vectors but this model gives BM25 ones"):
        export_to_qdrant(client, "learned", TOY_DOCS, DenseToy(), kind="hybrid")
    assert client.get_collection("learned").points_count == before


def test_bm25_idf_counts_documents_without_terms_as_in_process():
    """Stopword-only documents still count in N (Qdrant stores their empty sparse vectors)."""
    docs = Documents(["a", "b", "c", "d"], ["gout toe pain", "the a of", "asthma wheezing gout toe", "it is"])
    cfg = RetrieverConfig(kind="lexical")
    q = export_to_qdrant(QdrantClient(":memory:"), "c", docs, DenseToy(), config=cfg, model_name="toy")
    r = Retriever.build(docs, DenseToy(), config=cfg, model_name="toy", show_progress=False)
    a, b = q.search("gout toe", 4), r.search("gout toe", 4)
    assert a.ids == b.ids == ["a", "c"]
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)


@pytest.mark.parametrize("case", ["dense+bm25", "learned"])
def test_langchain_qdrant_vector_store_in_hybrid_mode_serves_a_medadapt_collection(tiny_bert, case):
    """LangChain's own QdrantVectorStore (retrieval_mode=HYBRID) over a medadapt collection gives the ranking and
    RRF scores of medadapt's server-side fusion (both prefetch k per list: depth = k) and medadapt's metadata."""
    pytest.importorskip("langchain_qdrant")
    from langchain_qdrant import RetrievalMode

    from medadapt.errors import ConfigError
    from medadapt.retrieval.langchain_qdrant import qdrant_vector_store

    model, docs, queries = (tiny_bert, tiny_docs(), QUERIES) if case == "dense+bm25" else (
        WeightedToy(), TOY_DOCS, TOY_QUERIES)
    k = 5
    cfg = RetrieverConfig(kind="hybrid", fusion={"method": "rrf", "rrf_k": 60, "depth": k})
    client, server, _ = _pair(model, docs, cfg, server_fusion="rrf")
    store = qdrant_vector_store(client, "c", model=model)
    assert store.retrieval_mode == RetrievalMode.HYBRID
    checked = 0
    for query in queries:
        lists = [server._query(u, v, k + 1)[0] for u, v in (("dense", [server._dense_queries([query])[0].tolist()]),
                                                             ("sparse", server._sparse_queries([query])))]
        if not all(_no_ties([p.score for p in pts]) for pts in lists):
            continue  # equal scores at a prefetch cut are ordered by Qdrant its own way
        want = server.search(query, k)
        got = store.similarity_search_with_score(query, k=k)
        checked += 1
        fused = [s for _, s in got]
        np.testing.assert_allclose(fused, want.scores, rtol=1e-9)  # Rrf(k = rrf_k + 1): medadapt's constant
        # equal fused scores (rank 1 + rank 2 = rank 2 + rank 1) are ordered by Qdrant its own way: compare
        # the documents per score, except at the cut, where a tie may keep another of the equal documents
        by_score = [{(round(s, 9), i) for s, i in zip(fused, [d.id for d, _ in got]) if round(s, 9) > round(fused[-1], 9)},
                    {(round(s, 9), i) for s, i in zip(want.scores, want.ids) if round(s, 9) > round(fused[-1], 9)}]
        assert by_score[0] == by_score[1]
        for doc, _ in got:  # medadapt's metadata and text, whatever the order
            j = want.ids.index(doc.id) if doc.id in want.ids else None
            if j is not None:
                assert doc.metadata["id"] == doc.id and doc.page_content == want.texts[j]
                assert doc.metadata["title"] == want.titles[j]
    assert checked >= 3
    assert store.as_retriever(search_kwargs={"k": 3}).invoke(queries[0])[0].id == server.search(queries[0], 3).ids[0]
    dense = qdrant_vector_store(client, "c", model=model, mode="dense")
    assert [d.id for d in dense.similarity_search(queries[0], k=3)] == [
        str(p.payload["doc_id"]) for p in server._query("dense", [server._dense_queries([queries[0]])[0].tolist()], 3)[0]]
    with pytest.raises(ConfigError, match="mode must be one of dense, sparse, hybrid, got 'fused'"):
        qdrant_vector_store(client, "c", model=model, mode="fused")
    export_to_qdrant(client, "d", docs, model, config=RetrieverConfig(kind="dense"), model_name="m")
    with pytest.raises(ConfigError, match="collection 'd' is dense: it has no vectors for mode 'hybrid'"):
        qdrant_vector_store(client, "d", model=model, mode="hybrid")
