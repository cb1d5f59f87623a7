"""Training-free ideas for real patients' questions (issue 40), on frozen all-MiniLM-L6-v2 and questiondoctors:
does anything at query or index time reach the +0.05 nDCG@10 that no head or fine-tune reached?

    python benchmarks/patients_questions_ideas.py --output benchmarks/results/patients_questions_ideas.json

Ideas (each setting chosen on dev, then scored once on test with a paired bootstrap CI against frozen):
- dense pseudo-relevance feedback (Rocchio on the query embedding: q + beta * mean of the top-k documents);
- document-neighbour smoothing (d + g * mean of its k nearest documents: answers to one question look alike);
- dense + BM25 fusion (medadapt.retrieval.fusion: min-max, z-score, RRF; the lexical weight chosen on dev).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _common import base_parser, finish  # noqa: E402
from eval_baselines import bm25_run  # noqa: E402

from medadapt.cache import EmbeddingCache  # noqa: E402
from medadapt.data import load_beir  # noqa: E402
from medadapt.eval import evaluate_run  # noqa: E402
from medadapt.eval.compare import paired_comparison, per_query_scores  # noqa: E402
from medadapt.eval.retrieval import dense_run, encode_split  # noqa: E402
from medadapt.models import load  # noqa: E402
from medadapt.retrieval.fusion import fuse_runs  # noqa: E402


def _norm(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--set", default="questiondoctors")
    p.add_argument("--resamples", type=int, default=10000)
    args = p.parse_args()
    data = load_beir(args.data_dir / args.set, ["dev", "test"])
    cache, model = EmbeddingCache(), load("minilm", device="cpu")
    splits = {}
    for split in ("dev", "test"):
        qids, q, dids, d = encode_split(model, data, split, cache, show_progress=False)
        splits[split] = (qids, _norm(q), dids, _norm(d))

    def ndcg(split, run):
        return evaluate_run(data.qrels[split], run, ["ndcg@10"])["ndcg@10"]

    def prf(split, k, beta):
        qids, q, dids, d = splits[split]
        top = np.argsort(-(q @ d.T), axis=1)[:, :k]
        return dense_run(qids, _norm(q + beta * d[top].mean(1)), dids, d, 100)

    def smooth(split, k, g):
        qids, q, dids, d = splits[split]
        sim = d @ d.T
        np.fill_diagonal(sim, -np.inf)
        nb = np.argsort(-sim, axis=1)[:, :k]
        return dense_run(qids, q, dids, _norm(d + g * d[nb].mean(1)), 100)

    def fusion(split, method, w):
        qids, q, dids, d = splits[split]
        return fuse_runs([dense_run(qids, q, dids, d, 100), bm25_run(data, split)], method=method,
                         weights=[1 - w, w])

    ideas = {
        "dense PRF (Rocchio)": (prf, list(itertools.product((2, 3, 5, 10), (0.3, 0.6, 1.0, 2.0)))),
        "document-neighbour smoothing": (smooth, list(itertools.product((1, 2, 3, 5), (0.2, 0.5, 1.0)))),
        "dense + BM25 fusion": (fusion, list(itertools.product(("minmax", "zscore", "rrf"), (0.1, 0.2, 0.3)))),
    }
    frozen = {s: dense_run(*splits[s], 100) for s in ("dev", "test")}
    base_pq = per_query_scores(data.qrels["test"], frozen["test"], "ndcg@10")
    rows = [{"idea": "frozen all-MiniLM-L6-v2", "setting": "-", "dev ndcg@10": round(ndcg("dev", frozen["dev"]), 4),
             "test ndcg@10": round(ndcg("test", frozen["test"]), 4)}]
    for name, (fn, grid) in ideas.items():
        dev = {setting: ndcg("dev", fn("dev", *setting)) for setting in grid}
        best = max(dev, key=dev.get)
        run = fn("test", *best)
        c = paired_comparison(base_pq, per_query_scores(data.qrels["test"], run, "ndcg@10"),
                              n_resamples=args.resamples)
        rows.append({"idea": name, "setting": str(best), "dev ndcg@10": round(dev[best], 4),
                     "test ndcg@10": round(ndcg("test", run), 4), "test delta": round(c.difference, 4),
                     "95% CI": f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]",
                     "dev grid": {str(k): round(v, 4) for k, v in dev.items()}})
    finish(args, rows, ["idea", "setting", "dev ndcg@10", "test ndcg@10", "test delta", "95% CI"],
           {"set": args.set})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
