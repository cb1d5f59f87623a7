"""Fusion weight of a composed MoE + learned-lexical model, chosen on dev, reported on test (issue #14).

    python benchmarks/fusion_weight.py --run runs/med-moe-embed-hybrid \
        --output benchmarks/results/fusion_weight.json

``--run`` is the folder of ``medadapt train recipes/med-moe-embed-hybrid.yaml`` (trained with the paper's
``dense_weight: 1``). The script sweeps ``S_lex + w * S_den`` over ``--weights`` on the dev split with
:func:`medadapt.hyrec.evaluate.tune_dense_weight` (one encoding pass; the dense side through the embedding
cache, the lexical side from the token-state cache), then evaluates lexical / dense / hybrid on the test
split at w = 1 and at the weight dev chose. What ``branches.0.eval.tune_dense_weight`` does inside the
recipe, on an already trained folder. Prints a table, writes JSON.
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
            "test": table, "tune_seconds": round(tune_s, 1), "eval_seconds": round(eval_s, 1),
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, 2 cores"}, indent=2) + "\n")


if __name__ == "__main__":
    main()
