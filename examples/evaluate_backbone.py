"""Evaluate a backbone on a BEIR folder (default: the builtin medmini set) and plot the metrics.

    python examples/evaluate_backbone.py                       # packaged MiniLM on medmini
    python examples/evaluate_backbone.py --data ../shared/data/medquad --split test
"""

from __future__ import annotations

import argparse

import medadapt
from medadapt.cache import EmbeddingCache
from medadapt.data import load_beir
from medadapt.eval import evaluate_retrieval, plot_results, results_table


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="minilm")
    p.add_argument("--data", default="medmini")
    p.add_argument("--split", default="test")
    p.add_argument("--plot", default=None, help="optional PNG path")
    args = p.parse_args()

    model = medadapt.load(args.model, device="cpu")
    data = load_beir(args.data, args.split)
    metrics = ["ndcg@10", "recall@100", "mrr@10", "precision@10", "f1@10", "accuracy@10"]
    results = evaluate_retrieval(model, data, args.split, metrics, cache=EmbeddingCache())

    from rich.console import Console

    Console().print(results_table({args.model: results}, "retrieval"))
    if args.plot:
        plot_results({args.model: results}, args.plot, title=f"{args.data} / {args.split}")


if __name__ == "__main__":
    main()
