"""MaxSim re-ranking of a multi-domain model, one weight per domain chosen on that domain's dev split (issue 40).

    python benchmarks/rerank_domains.py --model runs/multidomain-hybrid --sets medquad,questiondoctors \\
        --output benchmarks/results/rerank_domains.json

For each set (a domain of the model: its name is the domain's name): the model's first-stage run (its default
mode, hybrid for a composed model) on dev and test, the MaxSim scores of each query's top ``--depth``
candidates over the frozen backbone's token vectors (:class:`medadapt.retrieval.MaxSimReranker`, token vectors
through the embedding cache), and the z-score fusion at every weight of ``--grid`` on dev. The weight with the
best dev nDCG@10 becomes that domain's; then every test split is re-ranked as ``medadapt eval --rerank maxsim
--rerank-domain-weights ...`` re-ranks it (each query's weight routed by the model's domain classifier), with
paired bootstrap CIs against the first stage and against frozen all-MiniLM-L6-v2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish

METRICS = ["ndcg@10", "mrr@10", "recall@100"]


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="run folder of a model trained with domain routing")
    p.add_argument("--sets", default="medquad,questiondoctors", help="comma list; each set's name is a domain")
    p.add_argument("--grid", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1")
    p.add_argument("--known", default="",
                   help="name=weight,... for domains of the model not in --sets (weights chosen in an earlier run)")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--resamples", type=int, default=10_000)
    args = p.parse_args()

    import numpy as np

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_run
    from medadapt.eval.compare import paired_comparison, per_query_scores
    from medadapt.eval.tasks.base import evaluate
    from medadapt.eval.tasks.retrieval import RetrievalTask
    from medadapt.models import load
    from medadapt.retrieval.late import MaxSimConfig, MaxSimReranker, fuse_candidates

    sets = args.sets.split(",")
    grid = [float(w) for w in args.grid.split(",")]
    cache = EmbeddingCache()
    model = load(args.model, device="cpu")
    frozen = load("minilm", device="cpu")
    reranker = MaxSimReranker(model, MaxSimConfig(weight=1.0, depth=args.depth), cache=cache)

    def run_of(m, data, name: str, split: str, rerank=None) -> dict:
        runs: list = []
        task = RetrievalTask.create(name).load_data(data, split)
        evaluate(m, task, metrics=["ndcg@10"], cache=cache, show_progress=False, runs=runs, rerank=rerank)
        return runs[-1]

    data, chosen, dev_curves, seconds = {}, {}, {}, {}
    for name in sets:
        data[name] = load_beir(args.data_dir / name, ["dev", "test"])
        t = time.perf_counter()
        first = run_of(model, data[name], name, "dev")
        candidates = {q: sorted(r.items(), key=lambda x: -x[1])[: args.depth] for q, r in first.items()}
        queries = data[name].split_queries("dev")
        texts = sorted({data[name].doc_text(d) for c in candidates.values() for d, _ in c})
        reranker.tokens.vectors(model, texts, "document", desc=f"token vectors ({name} dev candidates)")
        late = {q: reranker.scores(queries[q], [data[name].doc_text(d) for d, _ in c]) for q, c in candidates.items()}
        curve = {}
        for w in grid:
            run = {}
            for q, c in candidates.items():
                order, fused = fuse_candidates(np.array([s for _, s in c]), late[q], w, "zscore")
                run[q] = {c[i][0]: float(f) for i, f in zip(order, fused)}
            curve[w] = round(evaluate_run(data[name].qrels["dev"], run, ["ndcg@10"])["ndcg@10"], 4)
        dev_curves[name] = curve
        chosen[name] = max(grid, key=lambda w: (curve[w], -w))  # ties: the smaller weight
        seconds[name] = round(time.perf_counter() - t, 1)
        print(f"{name}: dev nDCG@10 by weight {curve}; chosen {chosen[name]} ({seconds[name]} s)", flush=True)

    known = {k: float(v) for k, v in (item.split("=") for item in filter(None, args.known.split(",")))}
    routed = MaxSimConfig(domain_weights={**known, **chosen}, depth=args.depth)
    rows = []
    for name in sets:
        qrels = data[name].qrels["test"]
        first, base = run_of(model, data[name], name, "test"), run_of(frozen, data[name], name, "test")
        reranked = run_of(model, data[name], name, "test", rerank=routed)
        pq = {k: per_query_scores(qrels, r, "ndcg@10") for k, r in
              (("frozen", base), ("first", first), ("reranked", reranked))}
        for label, run in (("frozen all-MiniLM-L6-v2", base), ("first stage (served model)", first),
                           ("first stage + MaxSim, weight per domain", reranked)):
            row = {"set": name, "model": label, **{m: round(v, 4) for m, v in evaluate_run(qrels, run, METRICS).items()}}
            if run is reranked:
                for ref in ("frozen", "first"):
                    c = paired_comparison(pq[ref], pq["reranked"], n_resamples=args.resamples)
                    row[f"vs {ref}"] = f"{c.difference:+.4f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
            elif run is first:
                c = paired_comparison(pq["frozen"], pq["first"], n_resamples=args.resamples)
                row["vs frozen"] = f"{c.difference:+.4f} [{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
            rows.append(row)
            print(row, flush=True)
    finish(args, rows, ["set", "model", *METRICS, "vs frozen", "vs first"],
           {"model": args.model, "chosen_weights": chosen, "known_weights": known, "dev_curves": dev_curves, "depth": args.depth,
            "dev_seconds": seconds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
