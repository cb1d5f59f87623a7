"""HyReC on zh-med-qa and MedQuAD test (issue #6): baselines vs the learned lexical branch, dense, hybrid,
with and without the semantic union, plus sparsity.

    OMP_NUM_THREADS=1 python benchmarks/hyrec.py --datasets zh-med-qa --threads 1 \
        --output benchmarks/results/hyrec-zh.json
    OMP_NUM_THREADS=1 python benchmarks/hyrec.py --datasets medquad --threads 1 \
        --output benchmarks/results/hyrec-medquad.json

Rows per dataset: BM25 (jieba search mode for zh, stemmed English for MedQuAD; medadapt.retrieval's
LexicalIndex), frozen dense MiniLM (EmbeddingCache), min-max BM25 + dense fusion, then HyReC trained by
``recipes/hyrec-minilm-zh.yaml`` / ``recipes/hyrec-minilm-medquad.yaml`` (with semantic union) and the same
recipe with ``loss.union_weight=0`` (w/o SU): lexical-only, dense-only and hybrid (NM sum, eq. 9); and the
SU model bagged by the labelling tool (jieba + regex) instead of its union head (Table 3's "Jieba" row). Both HyReC
runs of a dataset share the on-disk SharedStateCache (``training.state_cache: disk``), so the frozen layers see
the corpus once.
Columns: nDCG@10, Recall@100, MRR@10, mean active terms per query / document, training seconds.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@100", "mrr@10"]
COLUMNS = ["dataset", "method", "ndcg@10", "recall@100", "mrr@10", "q_terms", "d_terms", "train s"]
DATASETS = {"zh-med-qa": ("zh", "hyrec-minilm-zh.yaml"), "medquad": ("en", "hyrec-minilm-medquad.yaml")}


def baselines(data, language: str, cache) -> tuple[list[dict], dict]:
    import medadapt
    from medadapt.eval import evaluate_retrieval
    from medadapt.eval.metrics import evaluate_run
    from medadapt.retrieval.config import LexicalConfig
    from medadapt.retrieval.fusion import fuse_runs
    from medadapt.retrieval.lexical import LexicalIndex

    queries = data.split_queries("test")
    qids = list(queries)
    index = LexicalIndex.build_bm25(data.doc_texts(), LexicalConfig(language=language), show_progress=False)
    s, i = index.search([queries[q] for q in qids], 100)
    ids = data.doc_ids
    bm25 = {q: {ids[j]: float(v) for v, j in zip(s[r], i[r]) if j >= 0} for r, q in enumerate(qids)}
    model = medadapt.load("minilm", device="cpu")
    dense_m, dense = evaluate_retrieval(model, data, "test", METRICS, cache=cache, show_progress=False,
                                        return_run=True)
    fused = fuse_runs([bm25, dense], "minmax", k=100)
    rows = [{"method": "BM25", **evaluate_run(data.qrels["test"], bm25, METRICS)},
            {"method": "MiniLM dense (frozen)", **dense_m},
            {"method": "min-max BM25 + dense", **evaluate_run(data.qrels["test"], fused, METRICS)}]
    return rows, {"bm25": bm25, "dense": dense}


def jieba_rows(name: str, out: Path, data, train_seconds: float, cache, states) -> list[dict]:
    from medadapt.hyrec import HyReCModel
    from medadapt.hyrec.evaluate import evaluate_modes
    from medadapt.hyrec.sections import HyReCEvalSection

    import yaml

    model = HyReCModel.load(out)
    model.config.union_source = "labels"
    saved = yaml.safe_load((out / "recipe.yaml").read_text(encoding="utf-8"))["eval"]
    ev = HyReCEvalSection(split="test", metrics=METRICS, modes=["lexical", "hybrid"],
                          dense_source=saved["dense_source"])
    res = evaluate_modes(model, data, ev, cache=cache, state_cache=states, show_progress=False,
                         cached_lexicon=True)
    rows = []
    for mode, m in res.items():
        rows.append({"dataset": name, "method": f"HyReC, jieba bagging {mode}", **{k: m[k] for k in METRICS},
                     "q_terms": round(m["q_terms"], 1), "d_terms": round(m["d_terms"], 1),
                     "train s": round(train_seconds, 1)})
        print(f"{name}: HyReC, jieba bagging {mode}: nDCG@10 {m['ndcg@10']:.4f}", flush=True)
    return rows


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "bench-hyrec")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override (both recipes)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (1 avoids oversubscription on a "
                   "shared, loaded machine)")
    args = p.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.hyrec.sections import HyReCRecipe
    from medadapt.recipes import load_recipe, run_recipe

    cache = EmbeddingCache()
    rows: list[dict] = []
    targets: dict[str, dict] = {}
    t_all = time.perf_counter()
    for name in args.datasets:
        language, recipe = DATASETS[name]
        data_dir = args.data_dir / name
        t0 = time.perf_counter()
        data = load_beir(data_dir, ["test"])
        base_rows, _ = baselines(data, language, cache)
        for r in base_rows:
            rows.append({"dataset": name, **r})
            print(f"{name}: {r['method']}: nDCG@10 {r['ndcg@10']:.4f}", flush=True)
        states = SharedStateCache(SharedStateCache.default_root())  # on disk: a re-run skips the frozen layers
        hy: dict[str, dict] = {}
        for label, extra in (("HyReC", []), ("HyReC w/o SU", ["loss.union_weight=0"])):
            out = args.runs_dir / f"{name}{'-nosu' if extra else ''}"
            shutil.rmtree(out, ignore_errors=True)  # a fresh run (overwrite: drop old checkpoints too)
            spec = load_recipe(ROOT / "recipes" / recipe, [f"data.path={data_dir}", *args.overrides, *extra],
                               expect=HyReCRecipe)
            res = run_recipe(spec, out, cache=cache, show_progress=True, evaluate=True, overwrite=True,
                             log=lambda m: print(m, flush=True))
            hy[label] = res.details["mode_metrics"]
            for mode in ("lexical", "dense", "hybrid"):
                m = hy[label][mode]
                rows.append({"dataset": name, "method": f"{label} {mode}", **{k: m[k] for k in METRICS},
                             "q_terms": round(m.get("q_terms", 0.0), 1) if mode != "dense" else "",
                             "d_terms": round(m.get("d_terms", 0.0), 1) if mode != "dense" else "",
                             "train s": round(res.train_seconds, 1)})
                print(f"{name}: {label} {mode}: nDCG@10 {m['ndcg@10']:.4f}", flush=True)
            if not extra:  # Table 3's "Jieba" row: the same model, bagged by the labelling tool instead
                rows += jieba_rows(name, out, data, res.train_seconds, cache, states)
        best = max(r["ndcg@10"] for r in base_rows)
        bm25 = base_rows[0]["ndcg@10"]
        targets[name] = {
            "best_baseline": best,
            "hybrid": hy["HyReC"]["hybrid"]["ndcg@10"],
            "hybrid >= best + 0.02": hy["HyReC"]["hybrid"]["ndcg@10"] >= best + 0.02,
            "lexical": hy["HyReC"]["lexical"]["ndcg@10"],
            "lexical >= BM25": hy["HyReC"]["lexical"]["ndcg@10"] >= bm25,
            "lexical w/o SU": hy["HyReC w/o SU"]["lexical"]["ndcg@10"],
            "union improves lexical": hy["HyReC"]["lexical"]["ndcg@10"] > hy["HyReC w/o SU"]["lexical"]["ndcg@10"],
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(f"{name}: {targets[name]}", flush=True)
    finish(args, rows, COLUMNS, {"targets": targets, "wall_seconds": round(time.perf_counter() - t_all, 1),
                                 "recipes": {n: f"recipes/{DATASETS[n][1]}" for n in args.datasets},
                                 "overrides": args.overrides})


if __name__ == "__main__":
    main()
