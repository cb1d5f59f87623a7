"""Evaluate a backbone on a BEIR folder (default: the builtin medquad-mini set) and plot the metrics.

    python examples/evaluate_backbone.py                       # packaged MiniLM on medquad-mini test
    python examples/evaluate_backbone.py --medquad ../shared/data/medquad        # the full MedQuAD set
    python examples/evaluate_backbone.py --data medmini --plot metrics.png

The first run encodes the corpus once (medquad-mini's 1,446 answers: about 50 seconds on 2 idle CPU cores;
the full MedQuAD's 14,220: 17-25 minutes) into the embedding cache (``$MEDADAPT_CACHE``); reruns take
seconds.
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
    p.add_argument("--data", default="medquad-mini", help="BEIR folder or builtin set (medquad-mini, medmini)")
    p.add_argument("--medquad", metavar="PATH", default=None,
                   help="the full MedQuAD BEIR folder (e.g. ../shared/data/medquad); overrides --data")
    p.add_argument("--split", default="test")
    p.add_argument("--plot", default=None, help="optional PNG path")
    args = p.parse_args()
    if args.medquad:
        args.data = args.medquad

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
