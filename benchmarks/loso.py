"""Leave-one-source-out generalisation on MedQuAD: train on five sources, evaluate on the sixth (issue #16).

    OMP_NUM_THREADS=1 python benchmarks/loso.py --models frozen,moe --output benchmarks/results/loso.json
    OMP_NUM_THREADS=1 python benchmarks/loso.py --sources 1_CancerGov_QA --models care --care-stage1 broad,recipe

(``OMP_NUM_THREADS=1`` on a shared CPU: with more threads than free cores the head training ran 10x slower.)

For each held-out source a fold is written under ``--work`` (default ``/tmp/medadapt-loso``; the corpus
and queries are links to the shared files, only the fold's qrels are new, see
:func:`medadapt.data.sources.leave_one_source_out`): ``train`` / ``dev`` / ``test-in`` are the train / dev /
test questions of the five other sources, ``test-out`` is every question (train, dev and test) of the
held-out source. Every model is evaluated on both test splits, in the same run:

* ``frozen``: frozen all-MiniLM-L6-v2 (nothing trained; the reference for both columns);
* ``moe``: ``recipes/med-moe-embed.yaml`` trained on the fold's ``train`` split (hard negatives mined from
  the whole corpus, so held-out documents can be negatives, never positives);
* ``care``: ``recipes/care-minilm-1layer.yaml`` with a broad stage I (``--care-stage1 broad``: every corpus
  document and the questions of every split, held-out source included, as unlabeled alignment text; stage
  II on the fold's labelled ``train`` split only), or the shipped narrow stage I (``--care-stage1 recipe``).

Columns: nDCG@10 on test-in and test-out, out/in ratio, and each model's figure as % of the frozen
backbone on the same split of the same fold; Recall@100 goes to the JSON. All embeddings go through the
medadapt cache, so with a warm MiniLM cache no corpus is re-encoded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, finish

REPO = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@100"]
SPLITS = ("test-in", "test-out")
MODELS = ("frozen", "moe", "care")


def care_overrides(fold: Path, stage1: str) -> list[str]:
    """Recipe overrides of the CARE run on ``fold``; ``broad`` aligns stage I on every corpus document and the
    questions of every split (the held-out source's too, as unlabeled text: no judgement of it is used)."""
    base = [f"data.path={fold}", "eval.split=test-in", "eval.expected={}"]
    if stage1 == "broad":
        base += ["stage1.query_splits=[train, dev, test-in, test-out]", "stage1.include_corpus=true",
                 "stage1.max_corpus_texts=null", "stage1.max_texts=null"]
    return base


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="medquad")
    p.add_argument("--sources", default="all", help="comma-separated held-out sources, or 'all'")
    p.add_argument("--models", default="frozen,moe", help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--work", type=Path, default=Path("/tmp/medadapt-loso"),
                   help="folds and trained models go here (outside the repository)")
    p.add_argument("--moe-recipe", type=Path, default=REPO / "recipes" / "med-moe-embed.yaml")
    p.add_argument("--care-recipe", type=Path, default=REPO / "recipes" / "care-minilm-1layer.yaml")
    p.add_argument("--care-stage1", default="broad",
                   help="comma-separated: 'broad' (all documents and questions) and/or 'recipe' (as shipped)")
    p.add_argument("--care-sources", default=None,
                   help="held-out sources CARE runs on (default: the first fold only; CARE is slow on a CPU)")
    args = p.parse_args()

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.data.sources import fold_counts, leave_one_source_out, query_sources
    from medadapt.errors import MedAdaptError
    from medadapt.eval import evaluate_retrieval
    from medadapt.models import load

    if not set(args.care_stage1.split(",")) <= {"broad", "recipe"}:
        raise MedAdaptError(f"--care-stage1 {args.care_stage1!r}: choose from broad, recipe")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise MedAdaptError(f"unknown model kind(s) {bad}; choose from {', '.join(MODELS)}")
    root = args.data_dir / args.dataset
    names = sorted(set(query_sources(root).values()))
    held = names if args.sources == "all" else [s.strip() for s in args.sources.split(",") if s.strip()]
    care_held = set(held[:1] if args.care_sources is None else args.care_sources.split(","))
    cache = EmbeddingCache()
    frozen = load("minilm", device="cpu")
    rows, folds = [], {}

    def row(model: str, source: str, scores: dict, seconds: float, reference: dict | None) -> dict:
        r = {"model": model, "held-out source": source}
        for split in SPLITS:
            for m in METRICS:
                r[f"{split} {m}"] = scores[split][m]
        r["out/in"] = scores["test-out"]["ndcg@10"] / scores["test-in"]["ndcg@10"]
        ref = reference or scores
        r["% frozen in"] = round(100 * scores["test-in"]["ndcg@10"] / ref["test-in"]["ndcg@10"], 1)
        r["% frozen out"] = round(100 * scores["test-out"]["ndcg@10"] / ref["test-out"]["ndcg@10"], 1)
        r["train s"] = round(seconds, 1)
        rows.append(r)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
        return r

    for source in held:
        _partial(args, rows, folds)  # an interrupted run keeps the folds it finished
        fold = leave_one_source_out(root, source, args.work / "folds" / source)
        folds[source] = fold_counts(fold)["splits"]
        print(f"fold {source}: " + ", ".join(f"{s} {c['queries']} q" for s, c in folds[source].items()), flush=True)
        data = load_beir(fold, list(SPLITS))

        def dense(model, data=data) -> dict:
            return {s: evaluate_retrieval(model, data, s, METRICS, cache=cache, show_progress=False) for s in SPLITS}

        reference = dense(frozen)  # the frozen backbone of this fold, always measured (same-run baseline)
        if "frozen" in models:
            row("frozen MiniLM", source, reference, 0.0, None)
        if "moe" in models:
            from medadapt.recipes import load_recipe, run_recipe

            recipe = load_recipe(args.moe_recipe, [f"data.path={fold}", "eval.split=test-in", "eval.expected={}"])
            t = time.perf_counter()
            res = run_recipe(recipe, args.work / "runs" / f"moe-{source}", cache=cache, show_progress=False,
                             evaluate=False, overwrite=True, log=lambda _m: None)
            seconds = res.train_seconds or time.perf_counter() - t
            row("MoE head (med-moe-embed.yaml)", source, dense(res.model), seconds, reference)
        if "care" in models and source in care_held:
            from medadapt.asym.evaluate import evaluate_asymmetric
            from medadapt.recipes import load_recipe, run_recipe

            for stage1 in args.care_stage1.split(","):
                recipe = load_recipe(args.care_recipe, care_overrides(fold, stage1))
                t = time.perf_counter()
                res = run_recipe(recipe, args.work / "runs" / f"care-{stage1}-{source}", cache=cache,
                                 show_progress=False, evaluate=False, overwrite=True, log=lambda _m: None)
                seconds = res.train_seconds or time.perf_counter() - t
                scores = {s: evaluate_asymmetric(res.model, data, s, METRICS, cache=cache, show_progress=False)
                          for s in SPLITS}
                row(f"CARE 1-layer, stage I {stage1}", source, scores, seconds, reference)

    columns = ["model", "held-out source", "test-in ndcg@10", "test-out ndcg@10", "out/in", "% frozen in",
               "% frozen out", "train s"]
    _rich_table(rows, columns)
    finish(args, rows, columns, {"folds": folds, "config": {k: str(v) for k, v in vars(args).items()}})
    return 0


def _partial(args, rows: list[dict], folds: dict) -> None:
    if args.output and rows:
        from medadapt.io import atomic_write_json

        atomic_write_json(args.output, {"complete": False, "rows": rows, "folds": folds})


def _rich_table(rows: list[dict], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Leave-one-source-out, MedQuAD (nDCG@10)")
    for c in columns:
        table.add_column(c, justify="left" if c in ("model", "held-out source") else "right")
    for r in rows:
        cells = []
        for c in columns:
            v = r.get(c, "")
            cells.append(f"{v:.1f}%" if c.startswith("%") else f"{v:.1f}" if c == "train s"
                         else f"{v:.4f}" if isinstance(v, float) else str(v))
        table.add_row(*cells)
    Console(width=160).print(table)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # a MedAdaptError is one line, like the CLI's
        from medadapt.errors import MedAdaptError

        if isinstance(e, MedAdaptError):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)
        raise
