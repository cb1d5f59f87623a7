"""CARE asymmetric retrieval on MedQuAD test: small query towers aligned to the MiniLM document tower.

    python benchmarks/care.py --output benchmarks/results/care.json --plot docs/img/care_qps.png

Document tower: the packaged all-MiniLM-L6-v2, frozen; its corpus embeddings come from the EmbeddingCache
(encoded once, ever). Query towers, built and trained as ``recipes/care-minilm.yaml`` (2-layer pruned copy),
``recipes/care-minilm-1layer.yaml`` (1-layer pruned copy, ``--pruned-recipes`` picks the pruned ones)
and ``recipes/care-minilm-static.yaml`` (StaticEmbedding distilled from the document tower) describe:
without alignment, after stage I (self-contrastive alignment, eq. 3), after stage I + II (stage II with the
document tower frozen: the CPU shortcut, see the recipes), plus for the pruned tower stage II alone
("w/o query align", with ``--stage2-only``) and the stage-I loss ablations (w/o MSE, w/o contrastive). Columns: nDCG@10 /
Recall@100 / MRR@10 on test, the share of the symmetric model's nDCG@10, query-encoding throughput (QPS,
batches of 64) and median single-query latency on this machine, the speed-up over the document tower
encoding the same queries, and training seconds. Targets (issue #7) are checked and reported in the JSON.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@100", "mrr@10"]
COLUMNS = ["query tower", "training", "ndcg@10", "recall@100", "mrr@10", "% of symmetric", "QPS", "p50 ms",
           "speed-up", "train s"]


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    palette = iter(["tab:blue", "tab:green", "tab:purple", "tab:red"])
    colors = {"MiniLM-L6 (symmetric)": "black"}
    for r in rows:
        if r["query tower"] not in colors:
            colors[r["query tower"]] = "tab:orange" if r["query tower"] == "static" else next(palette)
    order = sorted(rows, key=lambda r: (r["query tower"], r["ndcg@10"]))
    for k, r in enumerate(order):
        c = colors.get(r["query tower"], "gray")
        ax.scatter(r["QPS"], r["ndcg@10"], color=c, s=36, zorder=3)
        ax.annotate(f"{r['training']} ({r['ndcg@10']:.3f})", (r["QPS"], r["ndcg@10"]), fontsize=7,
                    xytext=(5, -3 + 7 * (k % 2)), textcoords="offset points")
    for name, c in colors.items():
        ax.scatter([], [], color=c, label=name)
    sym = next(r for r in rows if r["training"] == "symmetric")
    ax.axhline(0.95 * sym["ndcg@10"], color="gray", ls="--", lw=0.8, label="95% of symmetric nDCG@10")
    ax.set_xscale("log")
    ax.set_xlabel("query encoding throughput (queries / s, CPU, log scale)")
    ax.set_ylabel("nDCG@10 (MedQuAD test)")
    ax.set_title("CARE on CPU: query towers aligned to a frozen MiniLM document tower")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)


def measure_speeds(encoders: dict, queries: list[str], threads: int, repeats: int, latency_samples: int) -> dict:
    """Interleaved timing rounds over all encoders (so load from other jobs hits each alike): best QPS and
    median p50 / p90 over rounds, with ``threads`` torch threads."""
    import statistics

    import torch

    from medadapt.care import query_speed

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rounds: dict[str, list[dict]] = {name: [] for name in encoders}
        for _ in range(repeats):
            for name, encode in encoders.items():
                rounds[name].append(query_speed(encode, queries, latency_samples=latency_samples))
    finally:
        torch.set_num_threads(previous)
    return {name: {"qps": max(r["qps"] for r in rs), "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                   "p90_ms": statistics.median(r["p90_ms"] for r in rs)} for name, rs in rounds.items()}


def main() -> int:
    import torch

    from medadapt.care import (QueryAlignmentLoss, align_queries, build_asymmetric_model, evaluate_asymmetric,
                               joint_finetune, mined_pairs, self_contrastive_texts, teacher_targets)
    from medadapt.care.model import build_document_tower, build_query_tower
    from medadapt.care.sections import CareRecipe
    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_retrieval
    from medadapt.losses import AsymInfoNCELoss
    from medadapt.recipes import load_recipe

    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="medquad")
    p.add_argument("--pruned-recipes", type=Path, nargs="+",
                   default=[ROOT / "recipes" / "care-minilm.yaml", ROOT / "recipes" / "care-minilm-1layer.yaml"],
                   help="pruned-query-tower recipes, one row group each (the first also gives the shared data)")
    p.add_argument("--static-recipe", type=Path, default=ROOT / "recipes" / "care-minilm-static.yaml")
    p.add_argument("--plot", type=Path, default=None, help="write the accuracy-vs-QPS plot (PNG) here")
    p.add_argument("--cache-dir", type=Path, default=None, help="embedding cache (default: the medadapt cache)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   help="override both recipes: section.field=value (repeatable)")
    p.add_argument("--skip-ablations", action="store_true", help="skip the stage-I loss ablations")
    p.add_argument("--stage2-only", action="store_true", help="also train the pruned tower with stage II alone")
    p.add_argument("--part", choices=["all", "main", "ablations", "speed"], default="all",
                   help="run everything, or split across processes: main rows + timing, the ablations, or only "
                        "the timing (re-measured on an idle machine) applied to the rows of --rows-from")
    p.add_argument("--rows-from", type=Path, default=None,
                   help="with --part speed: a results JSON of --part main whose accuracy rows get the new timings")
    p.add_argument("--threads", type=int, default=None, help="torch threads for training and evaluation")
    p.add_argument("--latency-samples", type=int, default=200)
    p.add_argument("--speed-threads", type=int, default=1,
                   help="torch threads while timing query encoding (1 = one serving worker per core; robust to "
                        "other jobs on a shared machine)")
    p.add_argument("--speed-repeats", type=int, default=3, help="interleaved timing rounds (best QPS, median p50)")
    args = p.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    data_path = args.data_dir / args.dataset
    overrides = [f"data.path={data_path}", *args.overrides]
    recipes = {}
    for path in args.pruned_recipes:
        recipe = load_recipe(path, overrides, expect=CareRecipe)
        recipes[f"pruned {recipe.query.layers}-layer"] = recipe
    recipes["static"] = load_recipe(args.static_recipe, overrides, expect=CareRecipe)
    pruned_kinds = [k for k in recipes if k.startswith("pruned")]
    base = recipes[pruned_kinds[0]]
    torch.manual_seed(base.training.seed)
    cache = EmbeddingCache(args.cache_dir)
    data = load_beir(data_path, sorted({*base.stage1_splits(), base.stage2_split(), base.eval.split}))
    split = base.eval.split
    test_queries = list(data.split_queries(split).values())
    doc_texts = data.doc_texts()
    bs = base.training.encode_batch_size
    document = build_document_tower(base.document, "cpu")

    t = time.perf_counter()
    sym = evaluate_retrieval(document, data, split, METRICS, cache=cache, show_progress=False)
    print(f"symmetric document model: ndcg@10={sym['ndcg@10']:.4f} ({time.perf_counter() - t:.0f} s)", flush=True)
    rows = [{"query tower": "MiniLM-L6 (symmetric)", "training": "symmetric", **sym, "% of symmetric": 100.0,
             "train s": 0.0}]
    encoders = {"MiniLM-L6 (symmetric)": document.encode_query}

    items = self_contrastive_texts(data, base.stage1_splits(), base.stage1.include_corpus,
                                   base.stage1.max_texts, base.training.seed, base.stage1.max_corpus_texts)
    texts = [x for x, _ in items]
    teacher = teacher_targets(document, items, cache, dim=document.get_embedding_dimension(),
                              batch_size=bs, show_progress=False)
    s2 = base.stage2
    pairs = mined_pairs(data, base.stage2_split(), s2.max_queries, s2.negatives, s2.skip_top, s2.depth, document,
                        cache, bs, base.training.seed)
    doc_table = torch.from_numpy(cache.encode(document, doc_texts, role="document", batch_size=bs,
                                              show_progress=False))
    print(f"{len(texts)} stage-I texts, {len(pairs)} stage-II pairs", flush=True)

    def row(kind, training, model, seconds):
        metrics = evaluate_asymmetric(model, data, split, METRICS, cache=cache, batch_size=bs)
        r = {"query tower": kind, "training": training, **metrics,
             "% of symmetric": 100.0 * metrics["ndcg@10"] / sym["ndcg@10"], "train s": round(seconds, 1)}
        print(f"  {kind:15s} {training:28s} ndcg@10={metrics['ndcg@10']:.4f} ({seconds:.0f} s train)", flush=True)
        rows.append(r)
        if args.output:  # partial results survive an interrupted run
            from medadapt.io import atomic_write_json

            atomic_write_json(args.output.with_suffix(".partial.json"), {"rows": rows})
        return r

    def fresh(kind):
        recipe = recipes[kind]
        q = build_query_tower(recipe.query, document, doc_texts + [x for x, r in items if r == "query"], "cpu")
        return build_asymmetric_model(q, document, device="cpu")

    def progress(name, step, total, record):
        if step % 50 == 0 or step == total:
            print(f"    [{name}] {step}/{total} loss={record['loss']:.4f}", flush=True)

    def stage1(model, kind, contrastive_weight=None, mse_weight=None):
        s1 = recipes[kind].stage1
        loss = QueryAlignmentLoss(s1.temperature, s1.contrastive_weight if contrastive_weight is None
                                  else contrastive_weight, s1.mse_weight if mse_weight is None else mse_weight)
        return align_queries(model, texts, teacher, s1, loss, max_length=s1.max_length, seed=base.training.seed,
                             progress=progress).seconds

    def stage2(model, kind):
        st = recipes[kind].stage2
        return joint_finetune(model, pairs, doc_texts, st, AsymInfoNCELoss(st.temperature), train_document=False,
                              doc_table=doc_table, query_max_length=st.query_max_length, seed=base.training.seed,
                              progress=progress).seconds

    if args.part == "ablations":
        kind = pruned_kinds[0]
        m = fresh(kind)
        row(kind, "stage I w/o MSE", m, stage1(m, kind, mse_weight=0.0))
        m = fresh(kind)
        row(kind, "stage I w/o contrastive", m, stage1(m, kind, contrastive_weight=0.0))
        finish(args, rows, ["query tower", "training", "ndcg@10", "recall@100", "mrr@10", "% of symmetric",
                            "train s"], {"part": "ablations"})
        return 0
    if args.part == "speed":  # timing depends on the architecture only, not on trained weights
        if args.rows_from is None:
            p.error("--part speed needs --rows-from")
        import json

        rows[:] = json.loads(args.rows_from.read_text())["rows"]
        for kind in recipes:
            encoders[kind] = fresh(kind).encode_query
    for kind in recipes if args.part != "speed" else []:
        t = time.perf_counter()
        model = fresh(kind)
        build_s = time.perf_counter() - t
        encoders[kind] = model.encode_query  # same architecture before and after training: timed once, below
        row(kind, "no alignment", model, build_s)
        s1_seconds = stage1(model, kind)
        row(kind, "stage I", model, build_s + s1_seconds)
        s2_seconds = stage2(model, kind)
        row(kind, "stage I + II", model, build_s + s1_seconds + s2_seconds)
        if kind == pruned_kinds[0] and args.stage2_only:
            m = fresh(kind)
            row(kind, "stage II only (w/o align)", m, stage2(m, kind))
        if kind == pruned_kinds[0] and not args.skip_ablations and args.part == "all":
            m = fresh(kind)
            row(kind, "stage I w/o MSE", m, stage1(m, kind, mse_weight=0.0))
            m = fresh(kind)
            row(kind, "stage I w/o contrastive", m, stage1(m, kind, contrastive_weight=0.0))

    speeds = measure_speeds(encoders, test_queries, args.speed_threads, args.speed_repeats, args.latency_samples)
    doc_qps = speeds["MiniLM-L6 (symmetric)"]["qps"]
    for r in rows:
        sp = speeds[r["query tower"]]
        r.update({"QPS": sp["qps"], "p50 ms": sp["p50_ms"], "p90 ms": sp["p90_ms"], "speed-up": sp["qps"] / doc_qps})
        print(f"{r['query tower']:22s} {r['training']:28s} ndcg@10={r['ndcg@10']:.4f} {sp['qps']:8.0f} q/s "
              f"p50 {sp['p50_ms']:.2f} ms")

    def best(kind, trainings=("stage I", "stage I + II")):
        return max((r for r in rows if r["query tower"] == kind and r["training"] in trainings),
                   key=lambda r: r["ndcg@10"])

    def get(kind, training):
        return next(r for r in rows if r["query tower"] == kind and r["training"] == training)

    # A pruned tower meets the target when the SAME tower keeps >= 95% and is >= 3x faster.
    pruned_ok = {k: best(k)["% of symmetric"] >= 95.0 and get(k, "no alignment")["speed-up"] >= 3.0
                 for k in pruned_kinds}
    targets = {
        **{f"{k} keeps >= 95% of symmetric nDCG@10": best(k)["% of symmetric"] >= 95.0 for k in pruned_kinds},
        **{f"{k} encodes queries >= 3x faster": get(k, "no alignment")["speed-up"] >= 3.0 for k in pruned_kinds},
        "a pruned tower keeps >= 95% AND is >= 3x faster": any(pruned_ok.values()),
        "static encodes queries >= 30x faster": get("static", "no alignment")["speed-up"] >= 30.0,
        **{f"stage I+II beats no alignment ({k})":
           get(k, "stage I + II")["ndcg@10"] > get(k, "no alignment")["ndcg@10"] for k in [*pruned_kinds, "static"]},
    }
    for name, ok in targets.items():
        print(f"target {'MET   ' if ok else 'MISSED'} {name}")
    for r in rows:
        r["QPS"] = round(r["QPS"], 1)
        r["p50 ms"] = round(r["p50 ms"], 2)
        r["p90 ms"] = round(r["p90 ms"], 2)
        r["% of symmetric"] = round(r["% of symmetric"], 1)
        r["speed-up"] = round(r["speed-up"], 1)
    if args.plot:
        plot(rows, args.plot)
        print(f"wrote {args.plot}")
    finish(args, rows, COLUMNS, {"targets": targets, "dataset": args.dataset, "split": split,
                                  "stage1_texts": len(texts), "stage2_pairs": len(pairs),
                                  "recipes": {k: v.model_dump(mode="json") for k, v in recipes.items()},
                                  "threads": torch.get_num_threads(), "speed_threads": args.speed_threads,
                                  "speeds": speeds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
