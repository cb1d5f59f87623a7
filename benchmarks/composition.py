"""Adapters and composition on MedQuAD (issue #14): the MoE head added through ``add_adapter`` and the
composed MoE + HyReC learned-lexical model, against the frozen backbone, in one run.

    python benchmarks/composition.py --moe-run runs/med-moe-embed --hybrid-run runs/med-moe-embed-hybrid \
        --output benchmarks/results/composition.json

The two run folders come from ``medadapt train recipes/med-moe-embed.yaml`` and
``medadapt train recipes/med-moe-embed-hybrid.yaml`` (pass ``--train`` to run them here). The script
evaluates the frozen backbone, the MoE adapter (dense) and the composed model (lexical, dense, hybrid) on
the test split through the embedding cache, reads training times and folder sizes from the runs, and times
query encoding (``--timing-queries`` test queries, best of ``--repeats``) for each model. Prints a table,
writes JSON.

``--composed-run LABEL=RUN`` (repeatable) adds any other composed dense + learned-lexical folder (lexical, dense,
hybrid rows, training time, folder size, query time), e.g. the CARE query tower + document-route MoE head +
learned lexical of ``recipes/care-query-ft-moe-hybrid.yaml``; ``--finetune-run RUN`` evaluates a fully
fine-tuned model in the same run (its corpus embeddings come from the cache when that model was evaluated
before, else they are re-encoded: the cost the composed models avoid).
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

from _common import best_time


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default="../shared/data/medquad")
    ap.add_argument("--split", default="test")
    ap.add_argument("--moe-run", type=Path, default=Path("runs/med-moe-embed"))
    ap.add_argument("--hybrid-run", type=Path, default=Path("runs/med-moe-embed-hybrid"))
    ap.add_argument("--composed-run", action="append", default=[], metavar="LABEL=RUN",
                    help="another composed (dense + learned-lexical) run folder to evaluate and time, e.g. "
                         "'CARE query tower + document MoE head + learned lexical=runs/care-query-ft-moe-hybrid'")
    ap.add_argument("--finetune-run", type=Path, default=None,
                    help="a fully fine-tuned model folder (e.g. BMRetriever stage II) evaluated in the same run")
    ap.add_argument("--train", action="store_true", help="train both recipes into the run folders first")
    ap.add_argument("--timing-queries", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output", type=Path, default=Path("benchmarks/results/composition.json"))
    args = ap.parse_args()
    bad = [item for item in args.composed_run if not all(item.rpartition("=")[::2])]
    if bad:  # before any model loads or data reads
        ap.error(f"--composed-run takes LABEL=RUN, got {bad}")

    import torch

    import medadapt
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.hyrec.evaluate import evaluate_modes
    from medadapt.hyrec.model import HyReCModel
    from medadapt.hyrec.sections import HyReCEvalSection

    root = Path(__file__).resolve().parents[1]
    if args.train:
        from medadapt.recipes import run_recipe

        for recipe, out in (("med-moe-embed.yaml", args.moe_run), ("med-moe-embed-hybrid.yaml", args.hybrid_run)):
            run_recipe(root / "recipes" / recipe, out, overwrite=True)
    cache = EmbeddingCache()
    data = load_beir(args.data, [args.split])
    metrics = ["ndcg@10", "recall@100", "mrr@10"]
    rows: list[dict] = []

    frozen = medadapt.load("minilm", device="cpu")
    moe = medadapt.load(str(args.moe_run), device="cpu")
    hybrid = HyReCModel.load(args.hybrid_run, device="cpu")
    for name, model in (("frozen all-MiniLM-L6-v2", frozen), ("MoE head via add_adapter", moe)):
        res = evaluate_retrieval(model, data, args.split, metrics, cache=cache, show_progress=False)
        rows.append({"method": name, **{k: res[k] for k in metrics}})
    ev = HyReCEvalSection(split=args.split, metrics=metrics, dense_source="cache")
    modes = evaluate_modes(hybrid, data, ev, cache=cache, show_progress=False)
    for mode in ("lexical", "dense", "hybrid"):
        rows.append({"method": f"composed MoE + learned lexical: {mode}", **{k: modes[mode][k] for k in metrics}})
    runs = [(rows[1], args.moe_run), (rows[-1], args.hybrid_run)]
    composed = {}
    for item in args.composed_run:
        label, _, path = item.rpartition("=")
        composed[label] = HyReCModel.load(path, device="cpu")
        modes = evaluate_modes(composed[label], data, ev, cache=cache, show_progress=False)
        for mode in ("lexical", "dense", "hybrid"):
            rows.append({"method": f"{label}: {mode}", **{k: modes[mode][k] for k in metrics}})
        runs.append((rows[-1], Path(path)))
    if args.finetune_run is not None:
        tuned = medadapt.load(str(args.finetune_run), device="cpu")
        res = evaluate_retrieval(tuned, data, args.split, metrics, cache=cache, show_progress=False)
        rows.append({"method": "full fine-tune (corpus re-encoded)", **{k: res[k] for k in metrics},
                     "folder_mb": round(folder_mb(args.finetune_run), 1)})

    for row, run in runs:
        log = json.loads((run / "train_log.json").read_text())
        row["train_seconds"] = log["train_seconds"]
        row["encode_seconds"] = log["encode_seconds"]
        row["folder_mb"] = round(folder_mb(run), 1)

    queries = [data.queries[q] for q in sorted(data.qrels[args.split])][: args.timing_queries]
    timings = {
        "frozen all-MiniLM-L6-v2": best_time(lambda: frozen.encode_query(queries, batch_size=64), args.repeats),
        "MoE head via add_adapter": best_time(lambda: moe.encode_query(queries, batch_size=64), args.repeats),
        "composed MoE + learned lexical: hybrid": best_time(
            lambda: hybrid.encode(queries, "query", lexical=True, dense=True, batch_size=64), args.repeats),
    }
    for label, model in composed.items():
        timings[f"{label}: hybrid"] = best_time(
            lambda model=model: model.encode(queries, "query", lexical=True, dense=True, batch_size=64), args.repeats)
    base = timings["frozen all-MiniLM-L6-v2"]
    for row in rows:
        if row["method"] in timings:  # frozen, MoE, and the composed model's hybrid row (dense + lexical)
            row["query_ms"] = round(1000 * timings[row["method"]] / len(queries), 3)
            row["query_time_vs_frozen"] = round(timings[row["method"]] / base, 3)

    print(f"\nMedQuAD {args.split} ({len(data.qrels[args.split])} queries), {platform.node()}, "
          f"{torch.get_num_threads()} threads")
    header = ["method", *metrics, "train s", "folder MB", "ms/query", "x frozen"]
    print(" | ".join(header))
    for r in rows:
        print(" | ".join([r["method"], *[f"{r[m]:.4f}" for m in metrics], str(r.get("train_seconds", "")),
                          str(r.get("folder_mb", "")), str(r.get("query_ms", "")),
                          str(r.get("query_time_vs_frozen", ""))]))
    out = {"data": args.data, "split": args.split, "machine": f"{platform.node()} {platform.processor()}",
           "threads": torch.get_num_threads(), "timing_queries": len(queries), "rows": rows,
           "runs": {"moe": str(args.moe_run), "hybrid": str(args.hybrid_run), "composed": args.composed_run,
                    "finetune": str(args.finetune_run) if args.finetune_run else None}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
