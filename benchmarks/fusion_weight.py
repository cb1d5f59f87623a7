"""Fusion weight of a composed MoE + learned-lexical model, chosen on dev, reported on test (issue #14).

    python benchmarks/fusion_weight.py --run runs/med-moe-embed-hybrid \
        --output benchmarks/results/fusion_weight.json

``--run`` is the folder of ``medadapt train recipes/med-moe-embed-hybrid.yaml`` (trained with the paper's
``dense_weight: 1``). The script sweeps ``S_lex + w * S_den`` over ``--weights`` on the dev split with
:func:`medadapt.hyrec.evaluate.tune_dense_weight` (one encoding pass; the dense side through the embedding
cache, the lexical side from the token-state cache), then evaluates lexical / dense / hybrid on the test
split at w = 1 and at the weight dev chose. What ``branches.0.eval.tune_dense_weight`` does inside the
recipe, on an already trained folder. Prints a table, writes JSON.

``--compare-fusions`` also tries the list fusions of :mod:`medadapt.retrieval.fusion` (min-max, z-score,
reciprocal rank) over the two top-100 lists, each with its dense weight chosen on the tune split from
``--list-weights``, and reports them on the test split beside ``S_lex + w * S_den``:

    python benchmarks/fusion_weight.py --run runs/care-query-ft-moe-hybrid \
        --weights 0.25,0.5,0.75,1,1.5,2,3,4,6,8,12,16 --compare-fusions --output benchmarks/results/fusion_methods.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--data", default="../shared/data/medquad")
    ap.add_argument("--tune-split", default="dev")
    ap.add_argument("--split", default="test")
    ap.add_argument("--weights", default="0.25,0.5,0.75,1,1.5,2,3,4,6,8,12,16")
    ap.add_argument("--compare-fusions", action="store_true",
                    help="also try minmax / zscore / rrf list fusion, weight chosen on the tune split")
    ap.add_argument("--list-weights", default="0.5,0.75,1,1.25,1.5,2,3")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()

    from medadapt.data import load_beir
    from medadapt.eval.metrics import evaluate_run
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.hyrec.evaluate import evaluate_hyrec, tune_dense_weight
    from medadapt.hyrec.model import HyReCModel

    weights = [float(w) for w in args.weights.split(",")]
    model = HyReCModel.load(args.run, device="cpu")
    states = SharedStateCache(SharedStateCache.default_root())
    common = {"dense_source": "cache", "state_cache": states, "cached_lexicon": True, "show_progress": False}
    t0 = time.perf_counter()
    best, dev_scores = tune_dense_weight(model, load_beir(args.data, [args.tune_split]), args.tune_split,
                                         weights, **common)
    tune_s = time.perf_counter() - t0
    test = load_beir(args.data, [args.split])
    metrics = ["ndcg@10", "recall@100", "mrr@10"]
    t0 = time.perf_counter()
    _, runs = evaluate_hyrec(model, test, args.split, "hybrid", metrics, return_runs=True,
                             dense_weights=sorted({1.0, best}), **common)
    rows = {"lexical": runs["lexical"], "dense (MoE head)": runs["dense"], "hybrid, w = 1 (paper)":
            runs["hybrid@1"], f"hybrid, w = {best:g} (chosen on {args.tune_split})": runs[f"hybrid@{best:g}"]}
    table = {name: evaluate_run(test.qrels[args.split], run, metrics) for name, run in rows.items()}
    eval_s = time.perf_counter() - t0
    fusions = {}
    if args.compare_fusions:
        fusions = compare_fusions(model, args, common, runs, test.qrels[args.split], metrics)
        for method, row in fusions.items():
            table[f"{method} fusion, w = {row['chosen']:g} (chosen on {args.tune_split})"] = row["test"]

    print("dev nDCG@10 by dense weight: " + ", ".join(f"{w:g}: {v:.4f}" for w, v in dev_scores.items()))
    print(f"| {args.split} | " + " | ".join(metrics) + " |")
    print("|---|" + "---|" * len(metrics))
    for name, vals in table.items():
        print(f"| {name} | " + " | ".join(f"{vals[m]:.4f}" for m in metrics) + " |")
    print(f"tuning {tune_s:.1f} s, test evaluation {eval_s:.1f} s")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({
            "run": str(args.run), "data": args.data, "tune_split": args.tune_split, "split": args.split,
            "weights": weights, "dev_ndcg@10": {f"{w:g}": v for w, v in dev_scores.items()}, "chosen": best,
            "test": table, "list_fusions": fusions, "tune_seconds": round(tune_s, 1), "eval_seconds": round(eval_s, 1),
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, 2 cores"}, indent=2) + "\n")


def compare_fusions(model, args, common: dict, test_runs: dict, test_qrels: dict, metrics: list[str]) -> dict:
    """For each list fusion: its dense weight chosen on the tune split (nDCG@10, ties to the weight listed
    first), then its test metrics from the same top-100 lists the ``S_lex + w * S_den`` rows used."""
    from medadapt.data import load_beir
    from medadapt.eval.metrics import evaluate_run
    from medadapt.hyrec.evaluate import evaluate_hyrec
    from medadapt.retrieval.fusion import fuse_runs, hybrid_weights

    weights = [float(w) for w in args.list_weights.split(",")]
    tune = load_beir(args.data, [args.tune_split])
    _, tune_runs = evaluate_hyrec(model, tune, args.tune_split, "hybrid", ["ndcg@10"], return_runs=True,
                                  **common)
    out = {}
    for method in ("minmax", "zscore", "rrf"):
        def fused(runs, w, method=method):
            return fuse_runs([runs["dense"], runs["lexical"]], method, hybrid_weights(w), k=100)

        scores = {w: evaluate_run(tune.qrels[args.tune_split], fused(tune_runs, w), ["ndcg@10"])["ndcg@10"]
                  for w in weights}
        best = max(weights, key=lambda w: (scores[w], -weights.index(w)))
        out[method] = {"tune_ndcg@10": {f"{w:g}": v for w, v in scores.items()}, "chosen": best,
                       "test": evaluate_run(test_qrels, fused(test_runs, best), metrics)}
        print(f"{method}: {args.tune_split} nDCG@10 " + ", ".join(f"{w:g}: {v:.4f}" for w, v in scores.items()))
    return out


if __name__ == "__main__":
    main()
