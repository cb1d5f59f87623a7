"""Issue #14: the learned-lexical branch of the composed hybrid run fused with a CARE query tower that was
fine-tuned against the frozen, cached MiniLM document tower (``recipes/care-minilm-query-ft.yaml``).

    python benchmarks/compose_query_ft.py --hybrid-run runs/med-moe-embed-hybrid \
        --query-run runs/care-minilm-query-ft --output benchmarks/results/compose_query_ft.json

Neither side re-encodes the corpus with a trained dense model: documents are the frozen MiniLM embeddings of
the embedding cache (the CARE document route), the lexical side reads the token-state cache. The dense side
of the hybrid (``S_lex + w * S_den``) is the CARE model's (queries through its fine-tuned tower); ``w`` is
chosen on dev and reported on test, as :func:`medadapt.hyrec.evaluate.tune_dense_weight` does for the
composed recipe. A score-level composition of two run folders: not yet one saved model.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hybrid-run", type=Path, required=True, help="medadapt train recipes/med-moe-embed-hybrid.yaml")
    ap.add_argument("--query-run", type=Path, required=True, help="medadapt train recipes/care-minilm-query-ft.yaml")
    ap.add_argument("--data", default="../shared/data/medquad")
    ap.add_argument("--weights", default="0.5,1,2,3,4,6,8,12,16,24,32")
    ap.add_argument("--output", type=Path, default=None)
    args = ap.parse_args()

    import medadapt
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval.metrics import evaluate_run
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.hyrec.evaluate import evaluate_hyrec, tune_dense_weight
    from medadapt.hyrec.model import HyReCModel

    model = HyReCModel.load(args.hybrid_run, device="cpu")
    care = medadapt.load(str(args.query_run), device="cpu")
    cache = EmbeddingCache()

    class CareDense:  # the hybrid's dense side read from the CARE model's query / document routes
        def encode(self, _st, texts, role="plain", **kw):
            return cache.encode(care, texts, role=role, **kw)

    common = {"dense_source": "cache", "cache": CareDense(), "show_progress": False, "cached_lexicon": True,
              "state_cache": SharedStateCache(SharedStateCache.default_root())}
    weights = [float(w) for w in args.weights.split(",")]
    t0 = time.perf_counter()
    best, dev = tune_dense_weight(model, load_beir(args.data, ["dev"]), "dev", weights, **common)
    test = load_beir(args.data, ["test"])
    metrics = ["ndcg@10", "recall@100", "mrr@10"]
    _, runs = evaluate_hyrec(model, test, "test", "hybrid", metrics, return_runs=True, dense_weights=[best], **common)
    table = {name: evaluate_run(test.qrels["test"], runs[key], metrics) for name, key in
             [("lexical branch", "lexical"), ("CARE query tower (dense)", "dense"),
              (f"hybrid, w = {best:g} (chosen on dev)", f"hybrid@{best:g}")]}
    seconds = time.perf_counter() - t0
    print("dev nDCG@10 by dense weight: " + ", ".join(f"{w:g}: {v:.4f}" for w, v in dev.items()))
    print("| test | " + " | ".join(metrics) + " |\n|---|" + "---|" * len(metrics))
    for name, vals in table.items():
        print(f"| {name} | " + " | ".join(f"{vals[m]:.4f}" for m in metrics) + " |")
    print(f"{seconds:.0f} s")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({
            "hybrid_run": str(args.hybrid_run), "query_run": str(args.query_run), "data": args.data,
            "dev_ndcg@10": {f"{w:g}": v for w, v in dev.items()}, "chosen": best, "test": table,
            "seconds": round(seconds, 1), "machine": f"{platform.machine()}, 2 cores"}, indent=2) + "\n")


if __name__ == "__main__":
    main()
