"""Same-run peer comparison and transfer matrix (issue 40): what a user would try first against medadapt's heads,
on real patients' questions (questiondoctors) and MedQuAD, every trained row scored on every set's test split.

    python benchmarks/peers.py --sets questiondoctors,medquad-mini,medquad \\
        --finetune-results /path/to/peers_finetune/out[,more] --output benchmarks/results/peers.json

Rows (each trained on one set's train split, settings chosen on that set's dev split, never on test):
BM25 (bm25s), the frozen packaged all-MiniLM-L6-v2, medadapt's ``linear`` query adapter (identity-initialised
d x d on the query embedding, in-batch negatives: LlamaIndex's / Chroma's adapter), ``search_adaptor``
(residual, zero-initialised, both sides), the Med-MoE-Embed head (both sides and query-only), and the full and
LoRA fine-tunes of ``benchmarks/peers_finetune.py`` (sentence-transformers MNRL; run on a GPU, read back as top-100
runs and scored here with the same metric code). ``multidomain`` rows train on MedQuAD + questiondoctors together
(``recipes/medical-multidomain.yaml``).

Every figure comes from one scorer (pytrec_eval through medadapt.eval) and one embedding cache; the paired
bootstrap CI (10,000 resamples) is of the row minus the frozen model on the same test queries.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402
from eval_baselines import bm25_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "mrr@10", "recall@100"]
MULTI = "medquad+questiondoctors"

#: head rows: name -> (recipe sections, query-only, dev grid of overrides).  Settings are chosen on dev.
HEADS: dict[str, tuple[dict, bool, list[dict]]] = {
    "linear query adapter": (
        {"head": {"kind": "linear", "route": "query"}, "loss": {"kind": "infonce", "temperature": 0.05},
         "training": {"epochs": 1, "batch_size": 64, "lr": 3e-3, "weight_decay": 0.0, "seed": 0}},
        True, [{"training": {"epochs": e, "lr": lr}} for lr in (3e-4, 3e-3) for e in (1, 5, 20)]),
    "Search-Adaptor": (
        {"head": {"kind": "search_adaptor"}, "loss": {"kind": "infonce", "temperature": 0.05},
         "training": {"epochs": 1, "batch_size": 64, "lr": 3e-3, "weight_decay": 0.0, "seed": 0}},
        False, [{"training": {"epochs": e, "lr": lr}} for lr in (3e-4, 3e-3) for e in (1, 5, 20)]),
    "MoE head (recipes/med-moe-embed.yaml)": (
        {"recipe": "med-moe-embed.yaml"}, False, [{}]),
    "MoE head (query only)": (
        {"recipe": "med-moe-embed.yaml", "head": {"route": "query"}}, True, [{}]),
}


#: sets whose dev grid is cut to LARGE_GRID's points (the 2-core CPU budget of one run)
LARGE = {"medquad"}
LARGE_GRID = [{"training": {"epochs": 5, "lr": 3e-4}}, {"training": {"epochs": 5, "lr": 3e-3}}]


def merged(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def data_path(args, name: str) -> str:
    folder = args.data_dir / name
    return str(folder) if folder.exists() else name  # builtin sets (medquad-mini) by name


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--sets", default="questiondoctors,medquad-mini,medquad")
    p.add_argument("--train-on", default=None, help="comma subset of --sets to train heads on (default: all)")
    p.add_argument("--heads", default=",".join(HEADS), help="comma subset of head rows")
    p.add_argument("--multidomain", action="store_true", help="add recipes/medical-multidomain.yaml rows")
    p.add_argument("--finetune-results", default="", help="peers_finetune.py output folders, comma-separated")
    p.add_argument("--work", type=Path, default=Path("/tmp/medadapt-peers"), help="run folders go here")
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--partial", type=Path, default=None,
                   help="JSONL of finished rows (with per-query scores): rows found there are not recomputed, "
                        "new ones are appended, so an interrupted run goes on where it stopped")
    args = p.parse_args()

    import numpy as np
    import yaml

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.eval import evaluate_run
    from medadapt.eval.compare import paired_comparison, per_query_scores
    from medadapt.eval.retrieval import evaluate_retrieval
    from medadapt.models import load
    from medadapt.recipes import load_recipe, run_recipe

    sets = args.sets.split(",")
    data = {s: load_beir(data_path(args, s), ["train", "dev", "test"]) for s in sets}
    cache = EmbeddingCache()
    frozen = load("minilm", device="cpu")
    per_query: dict[tuple[str, str], dict[str, float]] = {}  # (row key, set) -> per-query nDCG@10
    rows: list[dict] = []

    done: dict[str, dict] = {}
    if args.partial and args.partial.exists():
        for line in args.partial.read_text().splitlines():
            saved = json.loads(line)
            done[saved["key"]] = saved

    def score(key: str, method: str, trained_on: str, runs: dict, extra: dict) -> None:
        row = {"method": method, "trained on": trained_on, **extra}
        scores = {}
        for s, run in runs.items():
            res = evaluate_run(data[s].qrels["test"], run, METRICS)
            row.update({f"{s} {m}": round(v, 4) for m, v in res.items()})
            scores[s] = per_query_scores(data[s].qrels["test"], run, "ndcg@10")
        record(key, row, scores)

    def record(key: str, row: dict, scores: dict) -> None:
        for s, pq in scores.items():
            per_query[(key, s)] = pq
            if ("frozen", s) in per_query and key != "frozen":
                c = paired_comparison(per_query[("frozen", s)], pq, n_resamples=args.resamples)
                row[f"{s} delta"] = round(c.difference, 4)
                row[f"{s} 95% CI"] = f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]"
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.partial and key not in done:
            with open(args.partial, "a") as f:
                f.write(json.dumps({"key": key, "row": row, "scores": scores}) + "\n")

    def cached(key: str) -> bool:
        if key in done:
            record(key, done[key]["row"], done[key]["scores"])
        return key in done

    def model_runs(model) -> dict:
        return {s: evaluate_retrieval(model, data[s], "test", ["ndcg@10"], cache=cache, show_progress=False,
                                      return_run=True)[1] for s in sets}

    def dev_score(model, trained_on: str) -> float:
        names = trained_on.split("+")
        return float(np.mean([evaluate_retrieval(model, data[n], "dev", ["ndcg@10"], cache=cache,
                                                 show_progress=False)["ndcg@10"] for n in names]))

    # --- rows without training
    t = time.perf_counter()
    if not cached("frozen"):
        score("frozen", "frozen all-MiniLM-L6-v2", "-", model_runs(frozen),
              {"train s": 0.0, "re-encode": "no", "size": "-"})
    if not cached("bm25"):
        score("bm25", "BM25 (bm25s, English stemmer)", "-", {s: bm25_run(data[s], "test") for s in sets},
              {"train s": 0.0, "re-encode": "no", "size": "-"})
    print(f"baselines in {time.perf_counter() - t:.0f}s", flush=True)

    # --- heads trained here (CPU, cached embeddings)
    train_on = args.train_on.split(",") if args.train_on else sets
    for head_name in filter(None, args.heads.split(",")):
        spec, query_only, grid = HEADS[head_name]
        for trained_on in train_on:
            if cached(f"{head_name}|{trained_on}"):
                continue
            points = grid
            if trained_on in LARGE and len(grid) > 1:  # 20 epochs of 11.7k pairs cost minutes a point here
                points = [g for g in grid if g in LARGE_GRID] or grid[:1]
            base = {"kind": "moe", "name": "peer", "model": {"backbone": "minilm", "freeze_backbone": True},
                    "data": {"path": data_path(args, trained_on)}, "eval": {"split": "dev", "metrics": METRICS}}
            spec = dict(spec)
            if "recipe" in spec:
                shipped = yaml.safe_load((ROOT / "recipes" / spec["recipe"]).read_text())
                base = merged(base, {k: shipped[k] for k in ("head", "loss", "training") if k in shipped})
                base["data"]["hard_negatives"] = shipped["data"].get("hard_negatives")
            base = merged(base, {k: v for k, v in spec.items() if k != "recipe"})
            best = None
            for i, extra in enumerate(points):
                recipe = load_recipe(merged(base, extra))
                out = args.work / f"{head_name.split()[0]}-{trained_on}-{i}"
                res = run_recipe(recipe, out, cache=cache, evaluate=False, overwrite=True, show_progress=False,
                                 log=lambda *_: None)
                dev = dev_score(res.model, trained_on)
                print(f"{head_name} on {trained_on} {extra}: dev nDCG@10 {dev:.4f}", flush=True)
                if best is None or dev > best[0]:
                    best = (dev, extra, res, out)
            dev, extra, res, out = best
            size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
            score(f"{head_name}|{trained_on}", head_name, trained_on, model_runs(res.model),
                  {"dev ndcg@10": round(dev, 4), "chosen": json.dumps(extra) if extra else "as shipped",
                   "train s": round(res.train_seconds, 1),
                   "re-encode": "no" if query_only else "head over cached corpus",
                   "size": f"{size / 1e6:.2f} MB"})

    if args.multidomain and not cached("multidomain"):
        recipe = load_recipe(ROOT / "recipes" / "medical-multidomain.yaml")
        out = args.work / "multidomain"
        res = run_recipe(recipe, out, cache=cache, evaluate=False, overwrite=True, show_progress=False,
                         log=lambda *_: None)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        score("multidomain", "recipes/medical-multidomain.yaml", MULTI, model_runs(res.model),
              {"dev ndcg@10": round(dev_score(res.model, MULTI), 4), "train s": round(res.train_seconds, 1),
               "re-encode": "no", "size": f"{size / 1e6:.2f} MB"})

    # --- fine-tunes run by peers_finetune.py (GPU), epoch chosen on dev of the training set(s)
    for folder in filter(None, args.finetune_results.split(",")):
        folder = Path(folder)
        meta = json.loads((folder / "meta.json").read_text())
        for tag, info in meta["runs"].items():
            if tag == "frozen":
                continue
            if cached(tag):
                continue
            method, trained = tag.split("-", 1)
            trained_on = MULTI if trained == "both" else trained
            z = np.load(folder / f"{tag}.npz")

            def run_of(s, split, epoch):
                ids, qids = meta["doc_ids"][s], meta["qids"][f"{s}.{split}"]
                idx, sc = z[f"{s}.{split}.{epoch}.idx"], z[f"{s}.{split}.{epoch}.scores"]
                return {q: {ids[int(i)]: float(v) for i, v in zip(idx[j], sc[j])} for j, q in enumerate(qids)}

            names = trained_on.split("+")
            for n in names:
                data.setdefault(n, load_beir(data_path(args, n), ["train", "dev", "test"]))
            dev = [np.mean([evaluate_run(data[n].qrels["dev"], run_of(n, "dev", e), ["ndcg@10"])["ndcg@10"]
                            for n in names]) for e in range(info["epochs"])]
            epoch = int(np.argmax(dev))
            label = "full fine-tune (ST MNRL)" if method == "full" else "LoRA fine-tune (ST MNRL, r 16)"
            runs = {s: run_of(s, "test", epoch) for s in sets if s in meta["doc_ids"]}
            score(f"{tag}", label, trained_on, runs,
                  {"dev ndcg@10": round(float(dev[epoch]), 4), "chosen": f"epoch {epoch + 1} of {info['epochs']}",
                   "train s": f"{info['train_seconds'] * (epoch + 1) / info['epochs']:.0f} (GPU: {meta['device']})",
                   "re-encode": "full corpus", "size": f"{info['saved_bytes_fp32'] / 1e6:.1f} MB"})

    columns = ["method", "trained on", "chosen"]
    for s in sets:
        columns += [f"{s} ndcg@10", f"{s} delta", f"{s} 95% CI", f"{s} mrr@10", f"{s} recall@100"]
    columns += ["train s", "re-encode", "size"]
    finish(args, rows, columns, {"sets": sets, "metrics": METRICS,
                                 "finetune_meta": {f: json.loads((Path(f) / "meta.json").read_text()).get("args")
                                                   for f in filter(None, args.finetune_results.split(","))}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
