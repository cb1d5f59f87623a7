"""CPU backends for the packaged all-MiniLM-L6-v2 on MedQuAD: documents/s and test nDCG@10 per backend.

    python benchmarks/backends.py --output benchmarks/results/backends.json

Every backend (``torch``, ``onnx``, ``onnx-int8``, ``openvino``; those whose package is missing are
reported as skipped) is loaded once, each with its own fresh temporary folder for its export and its
embedding cache, so each really encodes. The corpus is the test split's relevant documents plus a fixed
random sample of the others (``--docs`` in all, seed ``--seed``), identical for every backend (``--docs 0``:
the whole corpus, 14,220 documents, ~17 min for torch alone on 2 idle cores). It is encoded longest first
(as the cache encodes) in blocks of ``--block`` documents, **round-robin** over the backends: every backend
encodes block 1, then every backend block 2, ... so a busy machine slows all backends alike.
``docs_per_s`` is documents over the summed time of a backend's blocks (same batch size, same thread
count: ``--threads`` sets torch's, which the other runtimes follow). ``load_s`` is the load including the
first export (cold). Queries are encoded after the corpus and not timed. nDCG@10 and the other metrics
are pytrec_eval's over all test queries against this corpus.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

METRICS = ["ndcg@10", "recall@100", "mrr@10"]
ALL = ["torch", "onnx", "onnx-int8", "openvino"]


def reduced(data, split: str, total: int, seed: int):
    """``data`` restricted to the relevant documents of ``split`` plus a seeded sample of the others."""
    from medadapt.data.beir import BeirDataset

    if total <= 0:
        return data
    relevant = {d for rels in data.qrels[split].values() for d, g in rels.items() if g > 0}
    others = sorted(d for d in data.corpus if d not in relevant)
    extra = random.Random(seed).sample(others, max(0, min(len(others), total - len(relevant))))
    keep = relevant | set(extra)
    corpus = {d: doc for d, doc in data.corpus.items() if d in keep}
    return BeirDataset(corpus=corpus, queries=data.queries, qrels={split: data.qrels[split]}, root=data.root)


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--backends", default=",".join(ALL), help="comma-separated backends")
    p.add_argument("--docs", type=int, default=2000, help="corpus size (relevant + sample); 0 = whole corpus")
    p.add_argument("--block", type=int, default=200, help="documents per round-robin block")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=13)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(args.threads)
    from medadapt.backends import require_backend
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.errors import MedAdaptError
    from medadapt.eval.metrics import evaluate_run
    from medadapt.eval.retrieval import dense_run
    from medadapt.models import load

    split = "test"
    data = reduced(load_beir(args.data_dir / "medquad", [split]), split, args.docs, args.seed)
    doc_texts, doc_ids = data.doc_texts(), data.doc_ids
    queries = data.split_queries(split)
    qids = list(queries)
    backends, skipped = [], {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        try:
            require_backend(backend)
            backends.append(backend)
        except MedAdaptError as exc:
            skipped[backend] = str(exc)
            print(f"{backend}: skipped ({exc})", flush=True)
    order = sorted(range(len(doc_texts)), key=lambda i: -len(doc_texts[i]))  # longest first, like the cache
    blocks = [[doc_texts[i] for i in order[s:s + args.block]] for s in range(0, len(order), args.block)]
    with tempfile.TemporaryDirectory(prefix="medadapt-bench-backends-") as tmp:
        models, caches, load_s, encode_s = {}, {}, {}, {}
        for backend in backends:
            os.environ["MEDADAPT_CACHE"] = str(Path(tmp) / backend)  # this backend's export folder
            t0 = time.perf_counter()
            models[backend] = load("minilm", device="cpu", backend=backend)
            load_s[backend] = time.perf_counter() - t0
            caches[backend] = EmbeddingCache(Path(tmp) / backend / "embeddings")
            encode_s[backend] = 0.0
        for n, block in enumerate(blocks, 1):
            for backend in backends:
                t0 = time.perf_counter()
                caches[backend].encode(models[backend], block, role="document", batch_size=args.batch_size,
                                       show_progress=False)
                encode_s[backend] += time.perf_counter() - t0
            print(f"block {n}/{len(blocks)}: " + ", ".join(f"{b} {encode_s[b]:.0f} s" for b in backends), flush=True)
        rows = []
        for backend in backends:
            model, cache = models[backend], caches[backend]
            d = cache.encode(model, doc_texts, role="document", batch_size=args.batch_size, show_progress=False)
            q = cache.encode(model, [queries[i] for i in qids], role="query", batch_size=args.batch_size,
                             show_progress=False)
            run = dense_run(qids, q, doc_ids, d, 100, getattr(model, "similarity_fn_name", "cosine"))
            scores = evaluate_run(data.qrels[split], run, METRICS)
            rows.append({"backend": backend, "docs": len(doc_texts), "load_s": round(load_s[backend], 1),
                         "encode_s": round(encode_s[backend], 1),
                         "docs_per_s": round(len(doc_texts) / encode_s[backend], 1),
                         **{m: round(v, 4) for m, v in scores.items()}})
            print(rows[-1], flush=True)
    torch_row = next((r for r in rows if r["backend"] == "torch"), None)
    for r in rows:
        if torch_row is not None:
            r["speedup"] = round(r["docs_per_s"] / torch_row["docs_per_s"], 2)
            r["ndcg@10_delta"] = round(r["ndcg@10"] - torch_row["ndcg@10"], 4)
    finish(args, rows, ["backend", "docs", "load_s", "encode_s", "docs_per_s", "speedup", *METRICS,
                        "ndcg@10_delta"],
           {"corpus": "whole" if args.docs <= 0 else
            f"{len(doc_texts)} documents: all {split}-relevant + seeded sample (seed {args.seed})",
            "queries": len(qids), "batch_size": args.batch_size, "threads": args.threads, "block": args.block,
            "skipped": skipped})
    return 0


if __name__ == "__main__":
    sys.exit(main())
