r"""Scale benchmark: a FAISS index over N synthetic 384-dim vectors shaped like MiniLM MedQuAD embeddings.

    python benchmarks/scale.py --n 1000000 --medquad --output benchmarks/results/scale.json
    python benchmarks/scale.py --n 10000000 --factory "IVF4096_HNSW32,PQ192x4fs,Refine(SQfp16)" \
        --train-size 160000 --settings "32:16:64,64:16:64,64:32:64" --output ...
    python benchmarks/scale.py --medquad-only --output ...     # the MedQuAD correctness check alone

Steps (each heavy step in its own process, so each peak RSS is its own):

1. *Generator*: the real MiniLM document embeddings of MedQuAD (14,220, from the embedding cache) are
   clustered (FAISS k-means, 256 clusters); a synthetic vector is a cluster centre (drawn with the
   clusters' frequencies) plus Gaussian noise with the residuals' covariance scaled to that cluster's
   spread, L2-normalised. Written as float16 to a memory-mapped file in chunks (``--workdir``, default
   /tmp). Queries: 1,000 real MiniLM MedQuAD query embeddings (test split, then dev).
2. *Exact*: recall@10 ground truth by exact inner-product search over the file in chunks.
3. *Index*: :func:`medadapt.retrieval.scale.build_dense_index` streams the file chunk by chunk (each chunk
   a fresh memory map, unmapped after use, so the file never becomes resident): training sample, train,
   add. Then single-query search (one query per call, ``--threads`` FAISS threads) for each search
   setting: QPS, p50 / p99 latency, recall@10 against exact.
4. *MedQuAD correctness*: frozen MiniLM test nDCG@10 through the exact FAISS index built from cached
   vectors and through Qdrant (embedded mode), both must equal the exact-search figure (0.7055).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import base_parser, finish  # noqa: E402

DIM = 384
GIB = 1024 ** 3


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


def _in_child(fn, *args):
    """Run ``fn(*args)`` in a fresh process; return its result (a dict) with that process's peak RSS."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(fn, args)


def _medquad_embeddings(data_dir: Path):
    import medadapt
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir

    data = load_beir(data_dir / "medquad")
    model = medadapt.load("minilm")
    cache = EmbeddingCache()
    d = cache.encode(model, data.doc_texts(), role="document", show_progress=False)
    return data, model, cache, d


def generate(data_dir: str, path: str, n: int, seed: int, chunk: int, n_queries: int) -> dict:
    """Fit the generator and write ``n`` float16 vectors to ``path`` (chunk by chunk) plus the queries."""
    import faiss

    from medadapt.retrieval.exact import normalize_rows

    faiss.omp_set_num_threads(2)
    t0 = time.perf_counter()
    data, model, cache, d = _medquad_embeddings(Path(data_dir))
    x = normalize_rows(np.asarray(d, dtype=np.float32))
    km = faiss.Kmeans(DIM, 256, niter=20, seed=seed, spherical=True)
    km.train(x)
    _, assign = km.index.search(x, 1)
    assign = assign.ravel()
    centers = km.centroids.astype(np.float64)
    resid = x - centers[assign]
    cov = np.cov(resid.T)
    eig, vec = np.linalg.eigh(cov)
    factor = (vec * np.sqrt(np.clip(eig, 0, None))).T  # z @ factor ~ N(0, cov)
    counts = np.bincount(assign, minlength=256).astype(np.float64)
    spread = np.array([np.sqrt((resid[assign == c] ** 2).sum(1).mean()) if counts[c] else 1.0 for c in range(256)])
    spread = spread / np.sqrt((resid ** 2).sum(1).mean())
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=(n, DIM))
    for start in range(0, n, chunk):
        b = min(chunk, n - start)
        c = rng.choice(256, size=b, p=counts / counts.sum())
        z = rng.standard_normal((b, DIM), dtype=np.float32) @ factor.astype(np.float32)
        v = centers[c].astype(np.float32) + z * spread[c, None].astype(np.float32)
        out[start:start + b] = normalize_rows(v).astype(np.float16)
    out.flush()
    del out
    splits = [s for s in ("test", "dev") if s in data.qrels]
    qtexts = [data.queries[q] for s in splits for q in data.qrels[s]][:n_queries]
    q = cache.encode(model, qtexts, role="query", show_progress=False)
    np.save(path + ".queries.npy", normalize_rows(np.asarray(q, dtype=np.float32)))
    return {"seconds": time.perf_counter() - t0, "peak_rss_gib": _rss_gib(), "bytes": os.path.getsize(path)}


def memmap_batches(path: str, chunk: int):
    """A re-iterable vector source over a float16 ``.npy`` file: each chunk a fresh memory map (unmapped
    after use, so pages read do not stay resident in this process)."""
    header = np.load(path, mmap_mode="r")
    n, dim, offset = header.shape[0], header.shape[1], header.offset
    del header

    def it():
        for start in range(0, n, chunk):
            b = min(chunk, n - start)
            m = np.memmap(path, dtype=np.float16, mode="r", offset=offset + start * dim * 2, shape=(b, dim))
            arr = np.array(m)  # one chunk in memory, float16
            del m
            yield np.arange(start, start + b), arr

    return it


def exact(path: str, k: int, chunk: int) -> dict:
    import faiss

    faiss.omp_set_num_threads(2)
    t0 = time.perf_counter()
    q = np.load(path + ".queries.npy")
    heap = faiss.ResultHeap(len(q), k, keep_max=True)
    for ids, arr in memmap_batches(path, chunk)():
        s, i = faiss.knn(q, arr.astype(np.float32), k, metric=faiss.METRIC_INNER_PRODUCT)
        heap.add_result(s, np.where(i >= 0, i + ids[0], -1))
    heap.finalize()
    np.save(path + f".gt{k}.npy", heap.I)
    return {"seconds": time.perf_counter() - t0, "peak_rss_gib": _rss_gib()}


def index_and_search(path: str, factory: str, train_size: int | None, settings: list, threads: int, chunk: int,
                     save: bool) -> dict:
    import faiss

    from medadapt.retrieval.config import DenseConfig
    from medadapt.retrieval.scale import build_dense_index

    faiss.omp_set_num_threads(threads)
    q = np.load(path + ".queries.npy")
    gt = np.load(path + ".gt10.npy")
    t0 = time.perf_counter()
    cfg = DenseConfig(factory=factory, train_size=train_size, chunk_size=chunk, use_gpu=False)
    index, ids, build = build_dense_index(memmap_batches(path, chunk), cfg, normalized=True)
    build_s = time.perf_counter() - t0
    rss_build = _rss_gib()
    del ids
    rows = []
    for nprobe, k_factor, ef in settings:
        index.config = cfg.model_copy(update={"nprobe": nprobe, "k_factor": k_factor, "ef_search": ef})
        index.apply_search_params()
        index.search(q[:50], 10)  # warm-up
        lat = []
        found = np.empty((len(q), 10), dtype=np.int64)
        t = time.perf_counter()
        for r in range(len(q)):
            s = time.perf_counter()
            _, p = index.search(q[r:r + 1], 10)
            lat.append(time.perf_counter() - s)
            found[r] = p[0]
        total = time.perf_counter() - t
        tb = time.perf_counter()
        index.search(q, 10)
        batch_s = time.perf_counter() - tb
        recall = float(np.mean([len(set(a) & set(g)) / 10 for a, g in zip(found, gt)]))
        rows.append({"nprobe": nprobe, "k_factor": k_factor, "ef_search": ef, "recall@10": recall,
                     "qps": len(q) / total, "p50_ms": float(np.percentile(lat, 50) * 1e3),
                     "p99_ms": float(np.percentile(lat, 99) * 1e3), "batch_qps": len(q) / batch_s})
    index_bytes = None
    if save:
        out = path + ".faiss"
        faiss.write_index(index.cpu_index(), out)
        index_bytes = os.path.getsize(out)
        os.remove(out)
    return {"build_s": build_s, "build": build, "rss_after_build_gib": rss_build, "peak_rss_gib": _rss_gib(),
            "rows": rows, "index_bytes": index_bytes}


def medquad_check(data_dir: str) -> dict:
    """Frozen MiniLM MedQuAD test nDCG@10: exact eval path, FAISS index from cached vectors, Qdrant."""
    from medadapt.eval.metrics import evaluate_run
    from medadapt.eval.retrieval import dense_run
    from medadapt.retrieval import Documents
    from medadapt.retrieval.scale import retriever_from_vectors

    data, model, cache, d = _medquad_embeddings(Path(data_dir))
    qs = data.split_queries("test")
    qids = list(qs)
    q = cache.encode(model, [qs[i] for i in qids], role="query", show_progress=False)
    metrics = ["ndcg@10", "recall@100"]
    out = {"exact (medadapt.eval)": evaluate_run(data.qrels["test"], dense_run(qids, q, data.doc_ids, d, 100), metrics)}
    ids = data.doc_ids
    docs = Documents(ids, [data.corpus[i]["text"] for i in ids], [data.corpus[i].get("title") or "" for i in ids])

    def score(retriever):
        res = retriever.batch_search([qs[i] for i in qids], 100, query_embeddings=q)
        return evaluate_run(data.qrels["test"], {qid: dict(zip(r.ids, r.scores)) for qid, r in zip(qids, res)},
                            metrics)

    out["FAISS Flat from cached vectors (scale.retriever_from_vectors)"] = score(
        retriever_from_vectors(docs, model, d, model_name="minilm"))
    try:
        from qdrant_client import QdrantClient
    except ImportError:
        return out
    from medadapt.retrieval.vectordb import export_to_qdrant

    t = time.perf_counter()
    r = export_to_qdrant(QdrantClient(":memory:"), "medquad", docs, model, vectors=d, model_name="minilm")
    export_s = time.perf_counter() - t
    out["Qdrant embedded (vectordb.export_to_qdrant, exact)"] = score(r)
    out["_qdrant_export_s"] = export_s
    return out


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--factory", default="IVF1024_HNSW32,PQ192x4fs,Refine(SQfp16)")
    p.add_argument("--train-size", type=int, default=None)
    p.add_argument("--settings", default="16:16:64,16:32:64,32:32:64",
                   help="search settings nprobe:k_factor:ef_search, comma separated")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=200_000)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--workdir", default="/tmp")
    p.add_argument("--keep", action="store_true", help="keep the vector file (reused by a later run of the same n)")
    p.add_argument("--medquad", action="store_true", help="also run the MedQuAD correctness check")
    p.add_argument("--medquad-only", action="store_true")
    args = p.parse_args()
    extra: dict = {}
    rows: list[dict] = []
    if args.medquad or args.medquad_only:
        mq = _in_child(medquad_check, str(args.data_dir))
        extra["medquad"] = mq
        for name, m in mq.items():
            if not name.startswith("_"):
                print(f"MedQuAD test {name}: nDCG@10 {m['ndcg@10']:.4f} recall@100 {m['recall@100']:.4f}")
    if not args.medquad_only:
        path = str(Path(args.workdir) / f"medadapt-scale-{args.n}.f16.npy")
        if not (args.keep and Path(path).is_file() and Path(path + ".queries.npy").is_file()):
            extra["generate"] = _in_child(generate, str(args.data_dir), path, args.n, 0, args.chunk, args.queries)
            print("generated", extra["generate"], flush=True)
        if not (args.keep and Path(path + ".gt10.npy").is_file()):
            extra["exact"] = _in_child(exact, path, 10, args.chunk)
            print("exact", extra["exact"], flush=True)
        settings = [tuple(float(v) if i == 1 else int(v) for i, v in enumerate(s.split(":")))
                    for s in args.settings.split(",")]
        res = _in_child(index_and_search, path, args.factory, args.train_size, settings, args.threads,
                        args.chunk, True)
        for r in res.pop("rows"):
            rows.append({"n": args.n, "factory": args.factory, **r, "build_s": res["build_s"],
                         "peak_rss_gib": res["peak_rss_gib"]})
        extra["index"] = res
        extra["note"] = ("2-core machine shared with other jobs during the run: times are inflated by contention; "
                         "peak_rss_gib is the index process's peak (build + search)")
        if not args.keep:
            for suffix in ("", ".queries.npy", ".gt10.npy"):
                Path(path + suffix).unlink(missing_ok=True)
    cols = ["n", "factory", "nprobe", "k_factor", "ef_search", "recall@10", "qps", "p50_ms", "p99_ms", "batch_qps",
            "build_s", "peak_rss_gib"]
    if rows:
        finish(args, rows, cols, extra)
    elif args.output:
        finish(args, [], cols, extra)


if __name__ == "__main__":
    main()
