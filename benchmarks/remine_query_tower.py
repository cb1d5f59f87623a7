"""Issue #14: a second round of hard negatives for the CARE query tower (ANCE-style re-mining).

``recipes/care-minilm-query-ft.yaml`` trains a full MiniLM query tower against the frozen, cached MiniLM
document tower with 7 hard negatives mined by the *document* tower (frozen MiniLM on both sides, ranks after
``stage2.skip_top``). This script trains the same recipe from the same initialisation, changing one thing: the
negatives are mined with a previous run's fine-tuned query tower (its query embeddings against the same cached
document embeddings), i.e. the harder negatives of a first round. It reports dev and test nDCG@10 of both runs
so the choice is made on dev.

    python benchmarks/remine_query_tower.py --previous runs/care-minilm-query-ft --output-run runs/qft-round2 \
        --output benchmarks/results/remine_query_tower.json

The recipe schema has no "mine with another model's query tower" setting (CARE's stage II mines with the
document tower, as the paper does), so for the run the script passes the previous tower as
:func:`medadapt.care.data.mined_pairs`' ``query_encoder``;
it is a benchmark, not a recipe option, because the measured result was negative (docs/benchmarks.md).
"""

from __future__ import annotations

from pathlib import Path

from _common import Timer, base_parser, finish


def main() -> None:
    ap = base_parser(__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="recipes/care-minilm-query-ft.yaml")
    ap.add_argument("--previous", type=Path, required=True, help="a run of --recipe: its query tower mines")
    ap.add_argument("--output-run", type=Path, required=True, help="folder for the round-2 run")
    ap.add_argument("--skip-top", type=int, default=None, help="override stage2.skip_top")
    args = ap.parse_args()

    import medadapt
    import medadapt.care.data as asym_data
    from medadapt.care.evaluate import evaluate_asymmetric
    from medadapt.care.model import tower
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.recipes import load_recipe, run_recipe

    cache = EmbeddingCache()
    miner = tower(medadapt.load(args.previous), "query")
    original = asym_data.mined_pairs

    def mined_by_previous(*a, **kw):
        return original(*a, **kw, query_encoder=miner)

    overrides = [] if args.skip_top is None else [f"stage2.skip_top={args.skip_top}"]
    spec = load_recipe(args.recipe, overrides)
    asym_data.mined_pairs = mined_by_previous
    try:
        with Timer() as t:
            result = run_recipe(spec, args.output_run, cache=cache, show_progress=True, evaluate=False, log=print)
    finally:
        asym_data.mined_pairs = original

    data = load_beir(spec.data.path)
    rows = []
    for label, run in (("round 1 (negatives mined by the document tower)", args.previous),
                       ("round 2 (negatives mined by round 1's query tower)", args.output_run)):
        model = medadapt.load(run)
        row = {"run": label}
        for split in ("dev", "test"):
            m = evaluate_asymmetric(model, data, split, metrics=("ndcg@10", "mrr@10"), cache=cache)
            row[f"{split} ndcg@10"], row[f"{split} mrr@10"] = m["ndcg@10"], m["mrr@10"]
        rows.append(row)
    rows[1]["train s"] = round(result.train_seconds, 1)
    rows[1]["wall s"] = round(t.seconds, 1)
    finish(args, rows, ["run", "dev ndcg@10", "test ndcg@10", "test mrr@10", "train s"])


if __name__ == "__main__":
    main()
