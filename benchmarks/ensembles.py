"""Score-level ensembles of lexical branches and of dense heads on one composed model (issue #14).

    HF_HUB_OFFLINE=1 python benchmarks/ensembles.py --base-run runs/care-query-ft-moe-hybrid \
        --lexical-runs runs/b12,runs/p128,... --dense-runs runs/head-e6,runs/head-e10,... \
        --output benchmarks/results/ensembles.json

``--base-run`` is a composed MoE + learned-lexical folder (``recipes/care-query-ft-moe-hybrid.yaml``).
``--lexical-runs`` are other composed folders on the same base model (same dense side, a differently trained
lexical branch); ``--dense-runs`` are dense folders on the same base model (a differently trained head on
the document route). For every subset of at most ``--max-size`` members the script averages the members'
exact score matrices (lexical: ``q . d`` of the learned sparse vectors over the whole corpus; dense: cosine
of the cached embeddings through the head), fuses ``S_lex + w * S_den`` with ``w`` chosen on the dev split
from ``--weights``, and reports dev and test. Averaging K sparse scores equals one sparse vector in K
disjoint term spaces, so a lexical ensemble would still be one inverted index; a dense ensemble is the
concatenation of the members' embeddings. This is the experiment before such a model exists: nothing is
trained here, every choice is made on dev and test is only reported. Prints a table, writes JSON.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
from _common import Timer, base_parser, finish

SPLITS = ("dev", "test")
METRICS = ["ndcg@10", "recall@100", "mrr@10"]


def lexical_scores(run: Path, data, states) -> dict[str, np.ndarray]:
    """``{split: (queries x documents) lexical scores}`` of a composed folder's learned-lexical branch."""
    from medadapt.hyrec.model import HyReCModel
    from medadapt.retrieval.inverted import to_csr

    model = HyReCModel.load(run, device="cpu")
    kw = {"batch_size": 32, "state_cache": states, "show_progress": False, "cached_pooled": False,
          "cached_lexicon": True}
    dtexts = data.doc_texts()
    states.warm(model, dtexts, "document", lexicon=True, pooled=False, show_progress=False)
    _, d_lex = model.encode(dtexts, "document", lexical=True, dense=False, **kw)
    docs = to_csr(d_lex, model.n_terms)
    out = {}
    for split in SPLITS:
        texts = list(data.split_queries(split).values())
        states.warm(model, texts, "query", lexicon=True, pooled=False, show_progress=False)
        _, q_lex = model.encode(texts, "query", lexical=True, dense=False, **kw)
        out[split] = np.asarray((to_csr(q_lex, model.n_terms) @ docs.T).todense(), np.float32)
    return out


def dense_scores(run: Path, data, cache) -> dict[str, np.ndarray]:
    """``{split: (queries x documents) cosine scores}`` of a folder's dense side, through the embedding
    cache (documents: the cached document-tower embeddings through the head, no transformer pass)."""
    from medadapt.models import load

    model = load(str(run), device="cpu")
    docs = np.asarray(cache.encode(model, data.doc_texts(), role="document", batch_size=64,
                                   show_progress=False), np.float32)
    out = {}
    for split in SPLITS:
        q = cache.encode(model, list(data.split_queries(split).values()), role="query", batch_size=64,
                         show_progress=False)
        out[split] = np.asarray(q, np.float32) @ docs.T
    return out


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--base-run", type=Path, required=True)
    p.add_argument("--lexical-runs", default="", help="comma-separated composed folders (other branches)")
    p.add_argument("--dense-runs", default="", help="comma-separated dense folders (other heads)")
    p.add_argument("--dataset", default="medquad")
    p.add_argument("--max-size", type=int, default=3)
    p.add_argument("--weights", default="0.5,0.75,1,1.5,2,3,4")
    args = p.parse_args()

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval.metrics import evaluate_run
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.retrieval.fusion import hybrid_score

    data = load_beir(args.data_dir / args.dataset, list(SPLITS))
    ids = data.doc_ids
    qids = {s: list(data.split_queries(s)) for s in SPLITS}
    weights = [float(w) for w in args.weights.split(",")]
    lex_runs = [args.base_run] + [Path(r) for r in args.lexical_runs.split(",") if r]
    den_runs = [args.base_run] + [Path(r) for r in args.dense_runs.split(",") if r]
    states, cache = SharedStateCache(SharedStateCache.default_root()), EmbeddingCache()
    with Timer() as t_enc:
        lex = {r.name: lexical_scores(r, data, states) for r in lex_runs}
        den = {r.name: dense_scores(r, data, cache) for r in den_runs}

    def evaluate(split: str, scores: np.ndarray, metrics: list[str]) -> dict[str, float]:
        top = np.argpartition(-scores, 100, axis=1)[:, :100]
        run = {q: {ids[j]: float(scores[r, j]) for j in top[r]} for r, q in enumerate(qids[split])}
        return evaluate_run(data.qrels[split], run, metrics)

    base = args.base_run.name
    candidates = [(c, (base,)) for k in range(1, args.max_size + 1) for c in itertools.combinations(lex, k)
                  if k > 1 or c == (base,)]
    candidates += [((base,), c) for k in range(2, args.max_size + 1) for c in itertools.combinations(den, k)]
    rows = []
    with Timer() as t_eval:
        for lex_members, den_members in candidates:
            s_lex = {s: sum(lex[m][s] for m in lex_members) / len(lex_members) for s in SPLITS}
            s_den = {s: sum(den[m][s] for m in den_members) / len(den_members) for s in SPLITS}
            dev = {w: evaluate("dev", hybrid_score(s_lex["dev"], s_den["dev"], w), ["ndcg@10"])["ndcg@10"]
                   for w in weights}
            best = max(weights, key=lambda w: (dev[w], -weights.index(w)))
            test = evaluate("test", hybrid_score(s_lex["test"], s_den["test"], best), METRICS)
            rows.append({"lexical": " + ".join(lex_members), "dense": " + ".join(den_members), "w": best,
                         "dev ndcg@10": dev[best], **{f"test {m}": v for m, v in test.items()}})
            print(f"{rows[-1]['lexical']} | {rows[-1]['dense']} | w {best:g} | dev {dev[best]:.4f} | "
                  f"test {test['ndcg@10']:.4f}", flush=True)
    chosen = max(rows, key=lambda r: r["dev ndcg@10"])
    print(f"dev chooses: lexical {chosen['lexical']}, dense {chosen['dense']}, w {chosen['w']:g}: "
          f"test nDCG@10 {chosen['test ndcg@10']:.4f}")
    finish(args, rows, ["lexical", "dense", "w", "dev ndcg@10", "test ndcg@10", "test recall@100",
                        "test mrr@10"],
           {"chosen_on_dev": chosen, "encode_seconds": round(t_enc.seconds, 1),
            "eval_seconds": round(t_eval.seconds, 1), "finished": time.strftime("%H:%M:%S")})


if __name__ == "__main__":
    main()
