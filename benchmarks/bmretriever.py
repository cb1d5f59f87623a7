"""BMRetriever on a CPU: the two-stage pipeline of ``recipes/bmretriever-minilm.yaml`` on MedQuAD test.

    python benchmarks/bmretriever.py --output benchmarks/results/bmretriever.json

Rows: the frozen MiniLM backbone (its embeddings come from the EmbeddingCache), stage II only (instruction
fine-tuning with mined hard negatives, ``stage1.enabled=false``), and stage I + II (contrastive
pre-training on focus-title -> answer pairs of the corpus, then stage II). Columns: nDCG@10 / Recall@100 /
MRR@10 on test, training seconds and evaluation (corpus re-encoding) seconds. Every fine-tuned model
re-encodes the 14k-document corpus once (the cache keys on weights); that dominates the wall time, so the
recipe trains at max_seq_length 128 on subsampled stages (``--stage1-pairs``, ``--stage2-queries``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@100", "mrr@10"]
COLUMNS = ["model", "stage I pairs", "stage II rows", *METRICS, "train s", "eval s"]


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--recipe", type=Path, default=ROOT / "recipes" / "bmretriever-minilm.yaml")
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "bench-bmretriever", help="model folders")
    p.add_argument("--stage1-pairs", type=int, default=None, help="override stage1.max_pairs")
    p.add_argument("--stage2-queries", type=int, default=None, help="override stage2.tasks[0].max_queries")
    p.add_argument("--skip", nargs="*", default=[], choices=["stage2-only", "two-stage", "synthetic"])
    p.add_argument("--synthetic", type=int, default=0,
                   help="also train stage II with N instance-level synthetic pairs and N task-level synthetic "
                        "examples from the deterministic FAKE generators (offline; a labelled stand-in for an LLM)")
    p.add_argument("--retrain", action="store_true",
                   help="train again even when --runs already holds a finished model (default: reuse it, so a "
                        "killed benchmark resumes; the embedding cache resumes the corpus encoding)")
    args = p.parse_args()

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.models import load
    from medadapt.recipes import load_recipe, run_recipe

    data_path = args.data_dir / "medquad"
    cache = EmbeddingCache()
    rows = []
    t0 = time.perf_counter()
    frozen = evaluate_retrieval(load("minilm", device="cpu"), load_beir(data_path, ["test"]), "test", METRICS,
                                cache=cache, show_progress=False)
    rows.append({"model": "MiniLM frozen", "stage I pairs": 0, "stage II rows": 0, **frozen, "train s": 0.0,
                 "eval s": round(time.perf_counter() - t0, 1)})
    print(rows[-1], flush=True)
    base_overrides = [f"data.path={data_path}", f"stage1.sources=[{{path: {data_path}, mode: title}}]"]
    if args.stage1_pairs:
        base_overrides.append(f"stage1.max_pairs={args.stage1_pairs}")
    variants = [("stage2-only", "stage II only", ["stage1.enabled=false"]), ("two-stage", "stage I + II", [])]
    if args.synthetic:
        variants.append(("synthetic", f"stage II + {args.synthetic} fake-generator synthetic pairs and tasks",
                         ["stage1.enabled=false",
                          f"stage2.synthetic={{generator: fake, passages: {args.synthetic}, top_k: 3}}",
                          f"stage2.task_synthetic={{generator: fake, tasks: {args.synthetic}}}"]))
    details = {}
    for key, label, extra in variants:
        if key in args.skip:
            continue
        recipe = load_recipe(args.recipe, base_overrides + extra)
        if args.stage2_queries:
            recipe.stage2.tasks[0].max_queries = args.stage2_queries
        out = args.runs / key
        log_file = out / "train_log.json"
        if log_file.is_file() and not args.retrain:
            import json

            saved = json.loads(log_file.read_text())
            st, train_s = saved["stages"], saved["train_seconds"] + saved["encode_seconds"]
            print(f"{key}: reusing the model trained earlier in {out}", flush=True)
        else:
            t1 = time.perf_counter()
            res = run_recipe(recipe, out, cache=cache, show_progress=False, evaluate=False, overwrite=args.retrain,
                             log=lambda m: print(m, flush=True))
            train_s, st = time.perf_counter() - t1, res.details["stages"]
        t2 = time.perf_counter()
        metrics = evaluate_retrieval(load(str(out), device="cpu"), load_beir(data_path, ["test"]), "test", METRICS,
                                     cache=cache, show_progress=False)
        rows.append({"model": f"BMRetriever-MiniLM ({label})",
                     "stage I pairs": st.get("stage1", {}).get("rows", 0),
                     "stage II rows": st.get("stage2", {}).get("rows", 0), **metrics,
                     "train s": round(train_s, 1), "eval s": round(time.perf_counter() - t2, 1)})
        details[key] = {"stages": {k: {kk: vv for kk, vv in v.items() if kk != "loss_history"}
                                   for k, v in st.items()}}
        print(rows[-1], flush=True)
    finish(args, rows, COLUMNS, {"recipe": str(args.recipe.relative_to(ROOT)) if args.recipe.is_relative_to(ROOT)
                                 else str(args.recipe), "details": details,
                                 "wall_seconds": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    main()
