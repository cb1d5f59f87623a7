"""Qdrant serving backend (medadapt.retrieval.vectordb), in Qdrant's embedded mode (no server process):
the same rankings as the in-process Retriever, persistence, metadata, and one clear error per bad input."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("qdrant_client")
from qdrant_client import QdrantClient, models  # noqa: E402

from medadapt.errors import MedAdaptError  # noqa: E402
from medadapt.retrieval import IndexMismatchError, Retriever, RetrieverConfig  # noqa: E402
from medadapt.retrieval.vectordb import COMPLETE, QdrantRetriever, export_to_qdrant  # noqa: E402

from conftest import build_tiny_bert  # noqa: E402
from _helpers import TOY_DOCS, ToyEncoder, tiny_docs  # noqa: E402  (the in-process index tests' corpora)


pytestmark = pytest.mark.usefixtures("_isolated_cache")


QUERIES = ["asthma inhaler", "uric acid toe", "sleep at night", "blood sugar"]


def test_dense_search_equals_the_faiss_retriever_with_metadata(tiny_bert):
    docs = tiny_docs()
    client = QdrantClient(":memory:")
    q = export_to_qdrant(client, "tiny", docs, tiny_bert, model_name="tiny")
    ref = Retriever.build(docs, tiny_bert, kind="dense", show_progress=False).batch_search(QUERIES, 5)
    got = q.batch_search(QUERIES, 5)
    assert [x.ids for x in got] == [x.ids for x in ref]
    np.testing.assert_allclose([x.scores for x in got], [x.scores for x in ref], atol=1e-5)
    hit = next(iter(got[0]))
    position = docs.ids.index(hit.id)
    assert (hit.text, hit.title) == (docs.texts[position], docs.titles[position])  # payload: document metadata
    info = client.get_collection("tiny")
    assert info.points_count == 24 and info.config.metadata[COMPLETE] is True
    assert info.config.params.vectors["dense"].size == 32
    assert info.config.params.vectors["dense"].distance == models.Distance.COSINE
    manifest = info.config.metadata["medadapt"]
    assert manifest["model"]["fingerprint"] and manifest["n_docs"] == 24 and manifest["corpus_hash"] == docs.content_hash()
    # reopening checks the given model against the recorded one and serves the same results
    again = QdrantRetriever(client, "tiny", model=tiny_bert)
    assert [x.ids for x in again.batch_search(QUERIES, 5)] == [x.ids for x in got]
    # precomputed vectors (e.g. from the embedding cache) give the same collection contents
    emb = tiny_bert.encode_document(docs.indexed_texts())
    pre = export_to_qdrant(client, "pre", docs, tiny_bert, vectors=emb, model_name="tiny")
    assert [x.ids for x in pre.batch_search(QUERIES, 5)] == [x.ids for x in got]


@pytest.mark.parametrize("kind, method", [("lexical", "minmax"), ("hybrid", "sum"), ("hybrid", "rrf"),
                                          ("hybrid", "minmax"), ("hybrid", "zscore")])
def test_learned_sparse_and_hybrid_equal_the_retriever(kind, method):
    cfg = RetrieverConfig(kind=kind, fusion={"method": method, "dense_weight": 0.5})
    q = export_to_qdrant(QdrantClient(":memory:"), "toy", TOY_DOCS, ToyEncoder(), config=cfg, model_name="toy")
    r = Retriever.build(TOY_DOCS, ToyEncoder(), config=cfg, model_name="toy", show_progress=False)
    for query in ["gout toe", "asthma sugar", "insulin wheezing asthma"]:
        a, b = q.search(query, 3), r.search(query, 3)
        assert a.ids == b.ids
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)
    if (kind, method) == ("hybrid", "sum"):  # lexical 2 (two shared terms) + 0.5 * dense 2 (dot product)
        assert q.search("gout toe", 1).scores[0] == pytest.approx(3.0)


def test_embedded_database_on_disk_reopens_and_serves_langchain(tiny_bert, tiny_bert_dir, tmp_path):
    docs = tiny_docs()
    client = QdrantClient(path=str(tmp_path / "db"))
    first = export_to_qdrant(client, "tiny", docs, str(tiny_bert_dir)).batch_search(QUERIES, 4)
    client.close()
    client = QdrantClient(path=str(tmp_path / "db"))
    reopened = QdrantRetriever(client, "tiny")  # reloads the model recorded in the collection's manifest
    assert [x.ids for x in reopened.batch_search(QUERIES, 4)] == [x.ids for x in first]
    pytest.importorskip("langchain_core")
    from medadapt.retrieval import MedAdaptRetriever

    lc = MedAdaptRetriever(retriever=reopened, k=3)
    sync, async_ = lc.invoke("uric acid toe"), asyncio.run(lc.ainvoke("uric acid toe"))
    assert [d.id for d in sync] == [d.id for d in async_] == first[1].ids[:3]
    assert sync[0].metadata["kind"] == "dense" and sync[0].metadata["rank"] == 1 and sync[0].page_content
    client.close()


def test_collection_of_another_dimension_distance_or_model_is_refused(tiny_bert, tmp_path):
    docs = tiny_docs()
    client = QdrantClient(":memory:")
    client.create_collection("dim16", vectors_config={"dense": models.VectorParams(size=16, distance=models.Distance.COSINE)})
    with pytest.raises(IndexMismatchError, match="holds 16-dim Cosine vectors but this model gives 32-dim Cosine") as err:
        export_to_qdrant(client, "dim16", docs, tiny_bert)
    assert "\n" not in str(err.value)
    client.create_collection("dot", vectors_config={"dense": models.VectorParams(size=32, distance=models.Distance.DOT)})
    with pytest.raises(IndexMismatchError, match="32-dim Dot vectors but this model gives 32-dim Cosine"):
        export_to_qdrant(client, "dot", docs, tiny_bert)
    assert client.get_collection("dot").points_count == 0  # nothing written into the foreign collection
    export_to_qdrant(client, "dim16", docs, tiny_bert, model_name="tiny", recreate=True)  # replaces it
    assert client.get_collection("dim16").config.params.vectors["dense"].size == 32

    other = build_tiny_bert(tmp_path / "other", seed=1)
    with pytest.raises(IndexMismatchError, match="built with model 'tiny'.*fingerprint"):
        QdrantRetriever(client, "dim16", model=str(other))
    with pytest.raises(IndexMismatchError, match="another export .*fingerprint"):
        export_to_qdrant(client, "dim16", docs, str(other))
    with pytest.raises(MedAdaptError, match="not written by medadapt"):
        QdrantRetriever(client, "dot", model=tiny_bert)
    with pytest.raises(MedAdaptError, match="does not exist"):
        QdrantRetriever(client, "missing", model=tiny_bert)


def test_unfinished_export_is_refused_and_resumes(tiny_bert):
    docs = tiny_docs()
    client = QdrantClient(":memory:")
    export_to_qdrant(client, "tiny", docs, tiny_bert, model_name="tiny")
    client.update_collection("tiny", metadata={COMPLETE: False})  # as left by an export killed midway
    with pytest.raises(MedAdaptError, match="export did not finish"):
        QdrantRetriever(client, "tiny", model=tiny_bert)
    again = export_to_qdrant(client, "tiny", docs, tiny_bert, model_name="tiny")  # same model: upserts, resumes
    assert client.get_collection("tiny").points_count == 24 and len(again.search("gout", 24)) == 24


def test_bad_vectors_are_refused_and_a_dense_model_gets_bm25(tiny_bert):
    docs = tiny_docs()
    client = QdrantClient(":memory:")
    export_to_qdrant(client, "x", docs, tiny_bert, kind="hybrid")  # BM25 sparse vectors (tests/test_retrieval_qdrant_fusion.py)
    assert client.get_collection("x").config.params.sparse_vectors["sparse"].modifier == models.Modifier.IDF
    emb = tiny_bert.encode_document(docs.indexed_texts())
    with pytest.raises(MedAdaptError, match="dimension 16 but the model gives 32"):
        export_to_qdrant(client, "y", docs, tiny_bert, vectors=emb[:, :16])
    with pytest.raises(MedAdaptError, match="gave 20 vectors for 24 documents"):
        export_to_qdrant(client, "z", docs, tiny_bert, vectors=emb[:20])
    with pytest.raises(MedAdaptError, match="export did not finish"):  # the failed export is never served
        QdrantRetriever(client, "z", model=tiny_bert)
