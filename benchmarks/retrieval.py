"""Retrieval benchmark: dense (FAISS Flat vs HNSW), lexical (medadapt inverted index vs bm25s) and
hybrid fusion, on medquad (14.2k documents) and on 1M synthetic vectors.

    nice -n 10 python benchmarks/retrieval.py --output benchmarks/results/retrieval.json

* medquad: BM25 through medadapt's inverted index vs bm25s (same tokens, same queries: test split),
  throughput including query tokenisation, single-threaded; nDCG@10 of dense (frozen MiniLM), BM25,
  and hybrid (min-max, RRF) on the test split. Dense embeddings come from the embedding cache.
* synthetic: ``--n-synthetic`` vectors of dimension ``--dim`` drawn from a Gaussian mixture (clustered,
  like real embeddings), Flat vs HNSW32 (efConstruction 40, efSearch swept over ``--ef-search``): build time,
  batch QPS, single-query p50/p99 latency, recall@10 against Flat.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import Timer, base_parser, finish  # noqa: E402


def latency(search, queries: np.ndarray, n: int = 200) -> tuple[float, float]:
    times = []
    for q in queries[:n]:
        t = time.perf_counter()
        search(q[None, :])
        times.append(time.perf_counter() - t)
    ms = np.asarray(times) * 1000
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def synthetic(n: int, dim: int, n_queries: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((1000, dim)).astype(np.float32)
    docs = np.empty((n, dim), dtype=np.float32)
    step = 100_000
    for s in range(0, n, step):
        m = min(step, n - s)
        docs[s : s + m] = centers[rng.integers(0, 1000, m)] + 0.6 * rng.standard_normal((m, dim)).astype(np.float32)
    queries = centers[rng.integers(0, 1000, n_queries)] + 0.6 * rng.standard_normal((n_queries, dim)).astype(np.float32)
    return docs, queries


def dense_rows(args) -> list[dict]:
    from medadapt.retrieval import DenseConfig, DenseIndex

    docs, queries = synthetic(args.n_synthetic, args.dim, args.n_queries)
    rows, ref = [], None
    for factory in ("Flat", "HNSW32"):
        cfg = DenseConfig(factory=factory, ef_construction=40, chunk_size=100_000)
        with Timer() as build:
            index = DenseIndex.build(docs, cfg)
        for ef in (args.ef_search if factory == "HNSW32" else [None]):
            if ef is not None:
                index.config.ef_search = ef
                index.apply_search_params()
            with Timer() as t:
                _, ids = index.search(queries, 10)
            p50, p99 = latency(lambda q, index=index: index.search(q, 10), queries)
            if ref is None:
                ref = ids
            recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ref)]))
            rows.append({"corpus": f"synthetic {args.n_synthetic // 1000}k x d{args.dim}",
                         "method": factory + (f" efSearch={ef}" if ef else ""),
                         "build_s": round(build.seconds, 1), "qps": round(len(queries) / t.seconds),
                         "p50_ms": round(p50, 3), "p99_ms": round(p99, 3), "recall@10_vs_flat": round(recall, 4)})
        del index
    return rows


def medquad_rows(args) -> list[dict]:
    import bm25s
    import faiss
    import Stemmer

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_run
    from medadapt.models import load
    from medadapt.retrieval import DenseConfig, DenseIndex, LexicalIndex
    from medadapt.retrieval.fusion import fuse_runs

    faiss.omp_set_num_threads(1)
    data = load_beir(args.data_dir / "medquad", ["test"])
    texts, doc_ids = data.doc_texts(), data.doc_ids
    queries = data.split_queries("test")
    qids = list(queries)
    qtexts = [queries[q] for q in qids]
    qrels = data.qrels["test"]
    rows = []

    def to_run(scores, idx):
        return {q: {doc_ids[j]: float(s) for s, j in zip(scores[r], idx[r]) if j >= 0} for r, q in enumerate(qids)}

    # lexical: medadapt vs bm25s, single thread, query tokenisation included
    with Timer() as b:
        lex = LexicalIndex.build_bm25(texts, show_progress=False)
    best = min(_timed(lambda: lex.search(qtexts, 100)) for _ in range(3))
    s, i = lex.search(qtexts, 100)
    bm25_run = to_run(s, i)
    rows.append({"corpus": "medquad", "method": "BM25 medadapt inverted index", "build_s": round(b.seconds, 1),
                 "qps": round(len(qtexts) / best), **_ndcg(evaluate_run, qrels, bm25_run)})
    stem = Stemmer.Stemmer("english")
    with Timer() as b:
        ref = bm25s.BM25()
        ref.index(bm25s.tokenize(texts, stopwords="en", stemmer=stem, show_progress=False), show_progress=False)

    def bm25s_search():
        qt = bm25s.tokenize(qtexts, stopwords="en", stemmer=stem, show_progress=False)
        return ref.retrieve(qt, k=100, show_progress=False, n_threads=1)

    best_ref = min(_timed(bm25s_search) for _ in range(3))
    d, sc = bm25s_search()
    rows.append({"corpus": "medquad", "method": "BM25 bm25s 0.3 (numpy backend)", "build_s": round(b.seconds, 1),
                 "qps": round(len(qtexts) / best_ref),
                 **_ndcg(evaluate_run, qrels, to_run(sc, d))})

    # dense + hybrid (embeddings through the cache)
    model = load(args.model, device="cpu")
    cache = EmbeddingCache()
    demb = cache.encode(model, texts, role="document", desc="encoding corpus")
    qemb = cache.encode(model, qtexts, role="query", desc="encoding queries")
    with Timer() as b:
        dense = DenseIndex.build(demb, DenseConfig(factory="Flat"))
    best_d = min(_timed(lambda: dense.search(qemb, 100)) for _ in range(3))
    s, i = dense.search(qemb, 100)
    dense_run = to_run(s, i)
    rows.append({"corpus": "medquad", "method": f"dense Flat ({args.model})", "build_s": round(b.seconds, 1),
                 "qps": round(len(qtexts) / best_d), **_ndcg(evaluate_run, qrels, dense_run)})
    for method, w in (("minmax", 0.5), ("minmax", 0.7), ("zscore", 0.5), ("rrf", 0.5)):
        with Timer() as t:
            fused = fuse_runs([dense_run, bm25_run], method, [w, 1 - w], k=100)
        rows.append({"corpus": "medquad", "method": f"hybrid {method} (dense weight {w})",
                     "qps": round(len(qtexts) / (t.seconds + best + best_d)),
                     **_ndcg(evaluate_run, qrels, fused)})
    faiss.omp_set_num_threads(2)
    return rows


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _ndcg(evaluate_run, qrels, run) -> dict:
    return {"ndcg@10": round(evaluate_run(qrels, run, ["ndcg@10"])["ndcg@10"], 4)}


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", default="minilm")
    p.add_argument("--n-synthetic", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--n-queries", type=int, default=1000)
    p.add_argument("--ef-search", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--skip", choices=["synthetic", "medquad"], default=None)
    args = p.parse_args()
    rows = []
    if args.skip != "medquad":
        rows += medquad_rows(args)
    if args.skip != "synthetic":
        rows += dense_rows(args)
    finish(args, rows, ["corpus", "method", "build_s", "qps", "p50_ms", "p99_ms", "recall@10_vs_flat", "ndcg@10"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
