"""Same-run peer comparison and transfer matrix (issue 40): what a user would try first against medadapt's heads,
on real patients' questions (questiondoctors) and MedQuAD, every trained row scored on every set's test split.

    python benchmarks/peers.py --sets questiondoctors,medquad-mini,medquad \\
        --finetune-results /path/to/peers_finetune/out[,more] --output benchmarks/results/peers.json
    python benchmarks/peers.py --rows hybrid,care --train-on questiondoctors,medquad-mini \\
        --output benchmarks/results/peers_extra.json    # only the composed hybrid and CARE rows

Rows (each trained on one set's train split, settings chosen on that set's dev split, never on test):
BM25 (bm25s), the frozen packaged all-MiniLM-L6-v2, medadapt's ``linear`` query adapter (identity-initialised
d x d on the query embedding, in-batch negatives: LlamaIndex's / Chroma's adapter), ``search_adaptor``
(residual, zero-initialised, both sides), the Med-MoE-Embed head (both sides and query-only), and the full and
LoRA fine-tunes of ``benchmarks/peers_finetune.py`` (sentence-transformers MNRL; run on a GPU, read back as top-100
runs and scored here with the same metric code), the composed hybrid (``recipes/med-moe-embed-hybrid.yaml``: the
MoE head plus HyReC's learned-lexical branch, scored in hybrid mode with the fusion weight the recipe chooses on the
training set's dev split) and the CARE query tower (``recipes/care-minilm-1layer.yaml``: a 1-layer query tower
aligned to the frozen MiniLM document embeddings, read from the cache: documents are not re-encoded).
``multidomain`` rows train on MedQuAD + questiondoctors together (``recipes/medical-multidomain-dense.yaml``).
``--rows`` picks the row groups to compute (the frozen model is always measured: every CI is against it).

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

#: row groups of --rows (``multidomain`` and the fine-tunes keep their own switches)
ROWS = ("bm25", "fusion", "heads", "hybrid", "care")
#: lexical-vs-dense weights of the untrained hybrid (BM25 + frozen MiniLM, min-max fusion), chosen on dev
FUSION_WEIGHTS = (0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0)
#: the composed rows, each trained as its recipe ships (the hybrid's one dev choice is its fusion weight)
HYBRID_RECIPE = "med-moe-embed-hybrid.yaml"
CARE_RECIPE = "care-minilm-1layer.yaml"
#: CARE's dev points, one row each (the shipped stage I aligns on the training questions and 1,000 random
#: documents; the second on every corpus document: unlabeled text, no test question)
CARE_VARIANTS = {"as shipped": [], "stage I on every document": ["stage1.max_corpus_texts=null"]}


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
    p.add_argument("--train-on", default=None, help="comma subset of --sets to train rows on (default: all)")
    p.add_argument("--rows", default=",".join(ROWS),
                   help=f"comma subset of the row groups {','.join(ROWS)} (frozen is always measured)")
    p.add_argument("--heads", default=",".join(HEADS), help="comma subset of head rows")
    p.add_argument("--care-variants", default=",".join(CARE_VARIANTS), help="comma subset of the CARE dev points")
    p.add_argument("--multidomain", action="store_true", help="add recipes/medical-multidomain-dense.yaml rows")
    p.add_argument("--finetune-results", default="", help="peers_finetune.py output folders, comma-separated")
    p.add_argument("--work", type=Path, default=Path("/tmp/medadapt-peers"), help="run folders go here")
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--partial", type=Path, default=None,
                   help="JSONL of finished rows (with per-query scores): rows found there are not recomputed, "
                        "new ones are appended, so an interrupted run goes on where it stopped")
    args = p.parse_args()
    groups = set(filter(None, args.rows.split(",")))
    if groups - set(ROWS):
        p.error(f"--rows: unknown row group(s) {sorted(groups - set(ROWS))}; choose from {', '.join(ROWS)}")

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
    if "bm25" in groups and not cached("bm25"):
        score("bm25", "BM25 (bm25s, English stemmer)", "-", {s: bm25_run(data[s], "test") for s in sets},
              {"train s": 0.0, "re-encode": "no", "size": "-"})
    print(f"baselines in {time.perf_counter() - t:.0f}s", flush=True)

    # --- the untrained hybrid a user would try first (the control for the composed hybrid's lexical side):
    # BM25 + frozen MiniLM, min-max fusion of the two top-100 lists, dense weight chosen on the set's dev split
    def frozen_run(s: str, split: str) -> dict:
        return evaluate_retrieval(frozen, data[s], split, ["ndcg@10"], cache=cache, show_progress=False,
                                  return_run=True)[1]

    for trained_on in (args.train_on.split(",") if args.train_on else sets) if "fusion" in groups else []:
        if cached(f"fusion|{trained_on}"):
            continue
        from medadapt.retrieval.fusion import fuse_runs

        pair = (bm25_run(data[trained_on], "dev"), frozen_run(trained_on, "dev"))
        curve = {w: evaluate_run(data[trained_on].qrels["dev"], fuse_runs(pair, "minmax", [1.0, w], k=100),
                                 ["ndcg@10"])["ndcg@10"] for w in FUSION_WEIGHTS}
        best = max(curve, key=curve.get)
        score(f"fusion|{trained_on}", "BM25 + frozen MiniLM (min-max fusion, untrained)", trained_on,
              {s: fuse_runs((bm25_run(data[s], "test"), frozen_run(s, "test")), "minmax", [1.0, best], k=100)
               for s in sets},
              {"dev ndcg@10": round(curve[best], 4), "chosen": f"dense weight {best:g} (of {len(curve)} on dev)",
               "train s": 0.0, "re-encode": "no (BM25 index beside the cached vectors)", "size": "-",
               "dev curve": {f"{w:g}": round(v, 4) for w, v in curve.items()}})

    # --- heads trained here (CPU, cached embeddings)
    train_on = args.train_on.split(",") if args.train_on else sets
    for head_name in filter(None, args.heads.split(",") if "heads" in groups else []):
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

    def recipe_for(name: str, trained_on: str, overrides: tuple = ()):
        # evaluate=False below: the run itself reports nothing; the hybrid's fusion weight is chosen on dev
        return load_recipe(ROOT / "recipes" / name, [f"data.path={data_path(args, trained_on)}", "eval.split=test",
                                                     "eval.expected={}", *overrides])

    def folder_size(out: Path) -> str:
        return f"{sum(f.stat().st_size for f in out.rglob('*') if f.is_file()) / 1e6:.2f} MB"

    # --- the composed hybrid: MoE head + HyReC learned-lexical branch, hybrid mode, fusion weight chosen on dev
    # (a head on the query route cannot be composed with the branch on a one-tower base: ConfigError by design)
    for trained_on in train_on if "hybrid" in groups else []:
        if cached(f"hybrid|{trained_on}"):
            continue
        from medadapt.hyrec.data import SharedStateCache
        from medadapt.hyrec.evaluate import evaluate_hyrec

        recipe = recipe_for(HYBRID_RECIPE, trained_on)
        out = args.work / f"hybrid-{trained_on}"
        t = time.perf_counter()
        res = run_recipe(recipe, out, cache=cache, evaluate=False, overwrite=True, show_progress=False,
                         log=lambda m: print(f"  {m}", flush=True))
        wall = time.perf_counter() - t
        ev = recipe.branches[-1].eval
        disk = recipe.branches[-1].training.state_cache == "disk"
        # batches of 256 (not 32) here and in evaluate_hyrec: every batch re-checks the shared layers' weights
        # (a norm over ~13M parameters), two thirds of the scoring time at 32 on this CPU; same states, same runs
        states = SharedStateCache(SharedStateCache.default_root(), batch_size=256) if disk else None
        runs, extra = {}, {}
        for s in sets:  # one encoding pass per set gives the lexical, dense and hybrid runs
            _, by_mode = evaluate_hyrec(res.model, data[s], "test", "hybrid", METRICS, cache=cache,
                                        state_cache=states, dense_source=ev.dense_source, fusion=ev.fusion,
                                        batch_size=max(ev.batch_size, 256), show_progress=False, return_runs=True,
                                        cached_lexicon=disk)
            runs[s] = by_mode["hybrid"]
            for mode in ("lexical", "dense"):
                extra[f"{s} {mode} ndcg@10"] = round(
                    evaluate_run(data[s].qrels["test"], by_mode[mode], ["ndcg@10"])["ndcg@10"], 4)
        tuning = res.details.get("dense_weight_tuning", {})
        weight = res.model.config.dense_weight
        score(f"hybrid|{trained_on}", "MoE head + learned lexical (med-moe-embed-hybrid.yaml), hybrid", trained_on,
              runs, {"dev ndcg@10": round(tuning.get("ndcg@10", {}).get(f"{weight:g}", float("nan")), 4),
                     "chosen": f"dense_weight {weight:g} (of {len(tuning.get('ndcg@10', {}))} on dev)",
                     "train s": round(res.train_seconds or wall, 1), "wall s": round(wall, 1),
                     "re-encode": "head over cached corpus + lexical index (2 layers)", "size": folder_size(out),
                     **extra, "dense_weight_tuning": tuning})

    # --- CARE: a 1-layer query tower aligned to frozen MiniLM's document embeddings (cached, never re-encoded)
    care_points = [(t, v) for t in train_on for v in filter(None, args.care_variants.split(","))]
    for trained_on, variant in care_points if "care" in groups else []:
        key = f"care|{trained_on}" + ("" if variant == "as shipped" else f"|{variant}")
        if cached(key):
            continue
        from medadapt.care.model import tower
        from medadapt.eval.retrieval import dense_run

        recipe = recipe_for(CARE_RECIPE, trained_on, CARE_VARIANTS[variant])
        out = args.work / f"care-{trained_on}" if variant == "as shipped" else \
            args.work / f"care-{trained_on}-{variant.replace(' ', '-')}"
        t = time.perf_counter()
        res = run_recipe(recipe, out, cache=cache, evaluate=False, overwrite=True, show_progress=False,
                         log=lambda m: print(f"  {m}", flush=True))
        wall = time.perf_counter() - t

        def care_run(model, s: str, split: str) -> dict:
            """The run of medadapt.care.evaluate.evaluate_asymmetric: queries through the query tower, documents
            through the document tower via the cache (frozen MiniLM's cached vectors)."""
            queries = data[s].split_queries(split)
            qids = list(queries)
            q = tower(model, "query").encode_query([queries[i] for i in qids], batch_size=64,
                                                   convert_to_numpy=True, show_progress_bar=False)
            d = cache.encode(tower(model, "document"), data[s].doc_texts(), role="document", batch_size=64,
                             show_progress=False)
            return dense_run(qids, np.asarray(q, dtype=np.float32), data[s].doc_ids, d, 100, "cosine")

        names = trained_on.split("+")
        dev = float(np.mean([evaluate_run(data[n].qrels["dev"], care_run(res.model, n, "dev"),
                                          ["ndcg@10"])["ndcg@10"] for n in names]))
        score(key, "CARE 1-layer query tower (care-minilm-1layer.yaml)", trained_on,
              {s: care_run(res.model, s, "test") for s in sets},
              {"dev ndcg@10": round(dev, 4), "chosen": variant,
               "train s": round(res.train_seconds or wall, 1), "wall s": round(wall, 1),
               "re-encode": "no (documents: frozen MiniLM, cached)",
               "size": f"{folder_size(out)} (query tower {folder_size(out / 'query_0_Transformer')}; the rest "
                       "is the frozen document tower)"})

    if args.multidomain and not cached("multidomain"):
        recipe = load_recipe(ROOT / "recipes" / "medical-multidomain-dense.yaml")
        out = args.work / "multidomain"
        res = run_recipe(recipe, out, cache=cache, evaluate=False, overwrite=True, show_progress=False,
                         log=lambda *_: None)
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        score("multidomain", "recipes/medical-multidomain-dense.yaml", MULTI, model_runs(res.model),
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
