"""MedQuAD test nDCG@10 / Recall@100 of one hybrid model: in-process fusion vs Qdrant (embedded) client-side and
server-side fusion, and LangChain's QdrantVectorStore over the same collection.

    python benchmarks/qdrant_fusion.py --data-dir ../shared/data [--model minilm] [--hyrec RUN_FOLDER [--no-base]] \
        [--output benchmarks/results/qdrant_fusion.json] [--only in-process "server-side RRF" LangChain]

Dense model + BM25 (Qdrant sparse vectors, IDF modifier), RRF with rrf_k = 60 (Qdrant: Rrf(k=61)), depth 100;
LangChain's store prefetches k = 100 per list, so it is the server-side RRF row at the same depth. With
--hyrec, the same for a learned-lexical model (fusion "rrf" too). The embedded Qdrant scores in Python: expect
tens of minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from qdrant_client import QdrantClient

import medadapt
from medadapt.data import load_beir
from medadapt.errors import MedAdaptError
from medadapt.eval.metrics import evaluate_run
from medadapt.retrieval import Documents, Retriever, RetrieverConfig
from medadapt.retrieval.encoders import offers_sparse
from medadapt.retrieval.vectordb import QdrantRetriever, export_to_qdrant

METRICS = ["ndcg@10", "recall@100"]
LANGCHAIN = "LangChain QdrantVectorStore, HYBRID (k=100)"


def _langchain_rows(client, model, texts):
    try:
        from medadapt.retrieval.langchain_qdrant import qdrant_vector_store
    except MedAdaptError:  # langchain-qdrant not installed: the row is skipped
        return None
    store = qdrant_vector_store(client, "medquad", model=model)
    return [store.similarity_search_with_score(t, k=100) for t in texts]


def run(name: str, model, docs, qids, texts, qrels, only: list[str] | None = None) -> list[dict]:
    cfg = RetrieverConfig(kind="hybrid", fusion={"method": "rrf", "rrf_k": 60, "depth": 100})
    client = QdrantClient(":memory:")
    export_to_qdrant(client, "medquad", docs, model, config=cfg, model_name=name)
    paths = {
        "in-process Retriever (rrf)": Retriever.build(docs, model, config=cfg, model_name=name, show_progress=False),
        "Qdrant, client-side rrf": QdrantRetriever(client, "medquad", model=model),
        "Qdrant, server-side RRF k=61": QdrantRetriever(client, "medquad", model=model, server_fusion="rrf"),
        "Qdrant, server-side DBSF": QdrantRetriever(client, "medquad", model=model, server_fusion="dbsf"),
    }
    q = paths["in-process Retriever (rrf)"].encode_queries(texts)
    paths[LANGCHAIN] = None
    if only:
        paths = {label: r for label, r in paths.items() if any(o in label for o in only)}
    rows = []
    sparse = "learned sparse" if offers_sparse(model) else "BM25"
    for label, r in paths.items():
        t = time.perf_counter()
        if r is None:
            got = _langchain_rows(client, model, texts)
            if got is None:
                continue
            run_ = {qid: {d.id: s for d, s in hits} for qid, hits in zip(qids, got)}
        else:
            res = r.batch_search(texts, 100, query_embeddings=q)
            run_ = {qid: dict(zip(x.ids, x.scores)) for qid, x in zip(qids, res)}
        m = evaluate_run(qrels, run_, METRICS)
        rows.append({"model": name, "sparse": sparse, "path": label, **m, "seconds": round(time.perf_counter() - t)})
        print(f"{name} + {sparse} | {label} | nDCG@10 {m['ndcg@10']:.4f} | Recall@100 {m['recall@100']:.4f} "
              f"| {rows[-1]['seconds']} s", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--model", default="minilm")
    p.add_argument("--hyrec", default=None)
    p.add_argument("--no-base", action="store_true", help="with --hyrec: skip the dense model + BM25 rows")
    p.add_argument("--output", default=None)
    p.add_argument("--only", nargs="*", default=None,
                   help="run only the paths whose label contains one of these (e.g. in-process server-side LangChain)")
    a = p.parse_args()
    data = load_beir(Path(a.data_dir) / "medquad")
    qs = data.split_queries("test")
    qids = list(qs)
    texts = [qs[i] for i in qids]
    ids = data.doc_ids
    docs = Documents(ids, [data.corpus[i]["text"] for i in ids], [data.corpus[i].get("title") or "" for i in ids])
    rows = [] if a.no_base and a.hyrec else run(a.model, medadapt.load(a.model), docs, qids, texts,
                                                 data.qrels["test"], a.only)
    if a.hyrec:
        rows += run(a.hyrec, medadapt.load(a.hyrec), docs, qids, texts, data.qrels["test"], a.only)
    if a.output:
        Path(a.output).write_text(json.dumps({"rows": rows, "machine": platform.platform(),
                                              "queries": len(qids)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
