"""Leave-one-source-out generalisation on MedQuAD: train on five sources, evaluate on the sixth (issue #16).

    OMP_NUM_THREADS=1 python benchmarks/loso.py --models frozen,moe --output benchmarks/results/loso.json
    OMP_NUM_THREADS=1 python benchmarks/loso.py --sources 1_CancerGov_QA --models care --care-stage1 broad,recipe
    OMP_NUM_THREADS=1 python benchmarks/loso.py --models hybrid --work /tmp/medadapt-loso-hybrid \
        --output benchmarks/results/loso_hybrid.json
    OMP_NUM_THREADS=1 python benchmarks/loso.py --models bmretriever --bmr-sources 1_CancerGov_QA,3_GHR_QA \
        --work /tmp/medadapt-loso-bmretriever --output benchmarks/results/loso_bmretriever.json
    OMP_NUM_THREADS=1 python benchmarks/loso.py --models care --care-stage1 broad --care-sources 3_GHR_QA,5_NIDDK_QA \
        --work /tmp/medadapt-loso-care --output benchmarks/results/loso_care.json --merge
    OMP_NUM_THREADS=1 python benchmarks/loso.py --sources 2_GARD_QA --models composed --composed-sources 2_GARD_QA \
        --work /tmp/medadapt-loso-composed --output benchmarks/results/loso_composed.json --merge

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
  II on the fold's labelled ``train`` split only), the shipped narrow stage I (``--care-stage1 recipe``), or
  the broad stage I alone with stage II off (``--care-stage1 broad-only``: alignment to the document tower,
  no labelled pair at all), or a broad stage I that sees no test question (``--care-stage1 broad-notest``:
  every corpus document and the train and dev questions: the held-out source's questions stay unseen);
  ``--care-recipe recipes/care-minilm.yaml`` gives the 2-layer tower (the row names the tower's depth),
  ``--care-recipe recipes/care-minilm-query-ft.yaml --care-stage1 recipe`` the full 6-layer query tower
  fine-tuned against the frozen, cached MiniLM document tower (issue #14's dense base);
* ``hybrid``: the composed model of ``recipes/med-moe-embed-hybrid.yaml`` (MoE head + HyReC learned-lexical
  branch) trained on the fold's ``train`` split, its fusion weight chosen by the recipe on the fold's ``dev``
  split; the row is its hybrid figure, the JSON adds its lexical-only and dense-only (MoE head) figures and
  the chosen weight (``--hybrid-sources``, default every fold);
* ``composed``: issue #14's one-folder model, ``recipes/care-query-ft-moe-hybrid.yaml`` (MoE head on the
  document route + learned-lexical branch) on the fold's CARE query-tower run (``--composed-base``, trained
  by ``recipes/care-minilm-query-ft.yaml`` on the fold's ``train`` split when the folder does not exist, so
  the ``care`` rows of that recipe can be reused); fusion weight chosen on the fold's ``dev`` split
  (``--composed-sources``, default the first fold only);
* ``bmretriever``: ``recipes/bmretriever-minilm.yaml`` stage II only (``stage1.enabled=false``, as
  ``benchmarks/bmretriever.py --skip two-stage``) on ``--bmr-queries`` (2,000) fold-train queries, hard
  negatives mined inside the recipe by the frozen base retriever; the fully fine-tuned model re-encodes the
  corpus once per fold (``--bmr-sources``, default the first fold only);
* ``finetune``: a full or LoRA fine-tune of the whole backbone trained elsewhere (a GPU) by
  ``benchmarks/peers_finetune.py --train SOURCE --eval-sets SOURCE --eval-splits dev,test-in,test-out`` on a
  data folder holding the fold under the source's name; ``--finetune-results`` is the folder of those runs,
  one sub-folder per held-out source; the epoch is chosen on the fold's dev split.

``--care-sources`` / ``--hybrid-sources`` / ``--composed-sources`` / ``--bmr-sources`` pick the folds a slow
model runs on (the frozen reference is measured on every fold of ``--sources``). ``--merge`` keeps the rows of
an existing ``--output`` that this run does not re-measure (same model and held-out source), so slow models can
fill a file fold by fold.

Columns: nDCG@10 on test-in and test-out, out/in ratio, and each model's figure as % of the frozen
backbone on the same split of the same fold; Recall@100 goes to the JSON. All embeddings go through the
medadapt cache, so with a warm MiniLM cache no corpus is re-encoded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, command_line, finish

REPO = Path(__file__).resolve().parents[1]
METRICS = ["ndcg@10", "recall@100"]
SPLITS = ("test-in", "test-out")
MODELS = ("frozen", "moe", "care", "hybrid", "composed", "bmretriever", "finetune")
MODES_HY = ("lexical", "dense", "hybrid")


STAGE1_MODES = ("broad", "recipe", "broad-only", "broad-notest")


def care_overrides(fold: Path, stage1: str) -> list[str]:
    """Recipe overrides of the CARE run on ``fold``; ``broad`` aligns stage I on every corpus document and the
    questions of every split (the held-out source's too, as unlabeled text: no judgement of it is used);
    ``broad-notest`` on every corpus document and the train and dev questions only (no test question of
    either test split is ever seen)."""
    base = [f"data.path={fold}", "eval.split=test-in", "eval.expected={}"]
    if stage1 in ("broad", "broad-only", "broad-notest"):
        splits = "[train, dev]" if stage1 == "broad-notest" else "[train, dev, test-in, test-out]"
        base += [f"stage1.query_splits={splits}", "stage1.include_corpus=true",
                 "stage1.max_corpus_texts=null", "stage1.max_texts=null"]
    if stage1 == "broad-only":
        base += ["stage2.enabled=false"]
    return base


def main() -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--dataset", default="medquad")
    p.add_argument("--sources", default="all", help="comma-separated held-out sources, or 'all'")
    p.add_argument("--models", default="frozen,moe", help=f"comma-separated subset of {','.join(MODELS)}")
    p.add_argument("--work", type=Path, default=Path("/tmp/medadapt-loso"),
                   help="folds and trained models go here (outside the repository)")
    p.add_argument("--moe-recipe", type=Path, default=REPO / "recipes" / "med-moe-embed.yaml")
    p.add_argument("--moe-label", default=None, help="row label of the moe model (default: from --moe-recipe)")
    p.add_argument("--moe-set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe override of the moe run (repeatable), e.g. eval.peers=[]")
    p.add_argument("--care-recipe", type=Path, default=REPO / "recipes" / "care-minilm-1layer.yaml")
    p.add_argument("--care-stage1", default="broad",
                   help="comma-separated: 'broad' (all documents and questions), 'recipe' (as shipped), "
                        "'broad-only' (broad stage I, stage II off) and/or 'broad-notest' (all documents, "
                        "train and dev questions)")
    p.add_argument("--care-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra recipe override of the CARE runs (repeatable), e.g. stage1.epochs=4")
    p.add_argument("--care-label", default="",
                   help="appended to the CARE rows' model name (say what --care-set changed)")
    p.add_argument("--care-sources", default=None,
                   help="held-out sources CARE runs on (default: the first fold only; CARE is slow on a CPU)")
    p.add_argument("--hybrid-recipe", type=Path, default=REPO / "recipes" / "med-moe-embed-hybrid.yaml")
    p.add_argument("--hybrid-sources", default=None, help="held-out sources the composed hybrid runs on (default: all)")
    p.add_argument("--hybrid-label", default="MoE + learned lexical (med-moe-embed-hybrid.yaml), hybrid",
                   help="row label of the hybrid model")
    p.add_argument("--hybrid-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override of --hybrid-recipe (repeatable), e.g. eval.also=[]")
    p.add_argument("--composed-base-recipe", type=Path, default=REPO / "recipes" / "care-minilm-query-ft.yaml")
    p.add_argument("--composed-recipe", type=Path, default=REPO / "recipes" / "care-query-ft-moe-hybrid.yaml")
    p.add_argument("--composed-base", default=None,
                   help="run folder of the fold's base model, with {source} for the held-out source (default: "
                        "WORK/runs/composed-base-{source}); trained there by --composed-base-recipe if absent")
    p.add_argument("--composed-sources", default=None,
                   help="held-out sources the composed model runs on (default: the first fold only)")
    p.add_argument("--bmr-recipe", type=Path, default=REPO / "recipes" / "bmretriever-minilm.yaml")
    p.add_argument("--bmr-queries", type=int, default=2000, help="stage II train queries of the fold (stage I is off)")
    p.add_argument("--bmr-sources", default=None,
                   help="held-out sources BMRetriever runs on (default: the first fold only; it re-encodes the corpus)")
    p.add_argument("--finetune-results", type=Path, default=None,
                   help="folder of benchmarks/peers_finetune.py runs, one per fold (<source>/meta.json), read by "
                        "--models finetune; folds without one are skipped")
    p.add_argument("--merge", action="store_true",
                   help="keep the rows of an existing --output that this run does not re-measure")
    args = p.parse_args()

    from medadapt.cache import EmbeddingCache
    from medadapt.data import load_beir
    from medadapt.data.sources import fold_counts, leave_one_source_out, query_sources
    from medadapt.errors import MedAdaptError
    from medadapt.eval import evaluate_retrieval
    from medadapt.models import load

    if not set(args.care_stage1.split(",")) <= set(STAGE1_MODES):
        raise MedAdaptError(f"--care-stage1 {args.care_stage1!r}: choose from {', '.join(STAGE1_MODES)}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in MODELS]
    if bad:
        raise MedAdaptError(f"unknown model kind(s) {bad}; choose from {', '.join(MODELS)}")
    root = args.data_dir / args.dataset
    names = sorted(set(query_sources(root).values()))
    held = names if args.sources == "all" else [s.strip() for s in args.sources.split(",") if s.strip()]
    def chosen(option: str | None, default: list[str]) -> set[str]:
        picked = default if option is None else [s.strip() for s in option.split(",") if s.strip()]
        unknown = [s for s in picked if s not in names]
        if unknown:
            raise MedAdaptError(f"unknown held-out source(s) {unknown}; choose from {', '.join(names)}")
        return set(picked)

    care_held = chosen(args.care_sources, held[:1])
    hybrid_held = chosen(args.hybrid_sources, held)
    bmr_held = chosen(args.bmr_sources, held[:1])
    composed_held = chosen(args.composed_sources, held[:1])
    cache = EmbeddingCache()
    frozen = load("minilm", device="cpu")
    rows, folds = [], {}
    kept, kept_folds, commands = _previous(args)

    def row(model: str, source: str, scores: dict, seconds: float, reference: dict | None,
            extra: dict | None = None) -> dict:
        r = {"model": model, "held-out source": source}
        for split in SPLITS:
            for m in METRICS:
                r[f"{split} {m}"] = scores[split][m]
        r["out/in"] = scores["test-out"]["ndcg@10"] / scores["test-in"]["ndcg@10"]
        ref = reference or scores
        r["% frozen in"] = round(100 * scores["test-in"]["ndcg@10"] / ref["test-in"]["ndcg@10"], 1)
        r["% frozen out"] = round(100 * scores["test-out"]["ndcg@10"] / ref["test-out"]["ndcg@10"], 1)
        r["train s"] = round(seconds, 1)
        r.update(extra or {})
        rows.append(r)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
        _partial(args, _merged(kept, rows), {**kept_folds, **folds})  # a killed run keeps every finished row
        return r

    for source in held:
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

            recipe = load_recipe(args.moe_recipe, [f"data.path={fold}", "eval.split=test-in", "eval.expected={}",
                                                    *args.moe_set])
            t = time.perf_counter()
            res = run_recipe(recipe, args.work / "runs" / f"moe-{source}", cache=cache, show_progress=False,
                             evaluate=False, overwrite=True, log=lambda _m: None)
            seconds = res.train_seconds or time.perf_counter() - t
            row(args.moe_label or f"MoE head ({args.moe_recipe.name})", source, dense(res.model), seconds, reference)
        if "care" in models and source in care_held:
            from medadapt.care.evaluate import evaluate_asymmetric
            from medadapt.recipes import load_recipe, run_recipe

            for stage1 in args.care_stage1.split(","):
                recipe = load_recipe(args.care_recipe, care_overrides(fold, stage1) + args.care_set)
                t = time.perf_counter()
                res = run_recipe(recipe, args.work / "runs" / f"care-{stage1}-{source}", cache=cache,
                                 show_progress=False, evaluate=False, overwrite=True, log=lambda _m: None)
                seconds = res.train_seconds or time.perf_counter() - t
                scores = {s: evaluate_asymmetric(res.model, data, s, METRICS, cache=cache, show_progress=False)
                          for s in SPLITS}
                label = {"broad-only": "stage I broad, no stage II",
                         "broad-notest": "stage I broad without test questions"}.get(stage1,
                                                                                     f"stage I {stage1}")
                q = recipe.query
                kind = getattr(q, "kind", None)
                tower = {"pruned": f"{getattr(q, 'layers', '?')}-layer",
                         "sentence_transformer": "full query tower"}.get(kind, kind or "query")
                suffix = f", {args.care_label}" if args.care_label else ""
                row(f"CARE {tower}, {label}{suffix}", source, scores, seconds, reference)
        if "hybrid" in models and source in hybrid_held:
            _hybrid_row(row, args.hybrid_recipe, args.hybrid_set, args.work / "runs" / f"hybrid-{source}", fold,
                        source, data, cache, reference, args.hybrid_label)
        if "composed" in models and source in composed_held:
            from medadapt.recipes import load_recipe, run_recipe

            template = args.composed_base or str(args.work / "runs" / "composed-base-{source}")
            base = Path(template.format(source=source))
            base_seconds = 0.0
            if not base.is_dir():  # run folders are replaced atomically: a folder that exists is complete
                recipe = load_recipe(args.composed_base_recipe, care_overrides(fold, "recipe"))
                t = time.perf_counter()
                res = run_recipe(recipe, base, cache=cache, show_progress=False, evaluate=False, overwrite=True,
                                 log=lambda _m: None)
                base_seconds = res.train_seconds or time.perf_counter() - t
            _hybrid_row(row, args.composed_recipe, [f"model.backbone={base.resolve()}"],
                        args.work / "runs" / f"composed-{source}", fold, source, data, cache, reference,
                        "CARE query tower + MoE head + learned lexical (care-query-ft-moe-hybrid.yaml), hybrid",
                        {"base run": str(base), "base train s": round(base_seconds, 1)})
        if "bmretriever" in models and source in bmr_held:
            from medadapt.recipes import load_recipe, run_recipe

            recipe = load_recipe(args.bmr_recipe, [f"data.path={fold}", "stage1.enabled=false",
                                                   "eval.split=test-in", "eval.expected={}",
                                                   f"stage2.tasks.0.max_queries={args.bmr_queries}"])
            out = args.work / "runs" / f"bmretriever-{source}"
            t = time.perf_counter()
            res = run_recipe(recipe, out, cache=cache, show_progress=False, evaluate=False, overwrite=True,
                             log=lambda m: print(m, flush=True))
            wall = time.perf_counter() - t
            t = time.perf_counter()
            tuned = load(str(out), device="cpu")
            scores = dense(tuned)  # the first split re-encodes the corpus with the fine-tuned weights, the second reuses it
            stage2 = res.details.get("stages", {}).get("stage2", {})
            row(f"BMRetriever-MiniLM stage II ({args.bmr_queries} q)", source, scores, res.train_seconds or wall,
                reference, {"stage II rows": stage2.get("rows"), "wall s": round(wall, 1),
                            "eval s": round(time.perf_counter() - t, 1)})

        if "finetune" in models and args.finetune_results and (args.finetune_results / source / "meta.json").exists():
            label, scores, seconds, extra = _finetune_scores(args.finetune_results / source, source,
                                                             load_beir(fold, ["dev", *SPLITS]))
            row(label, source, scores, seconds, reference, extra)

    columns = ["model", "held-out source", "test-in ndcg@10", "test-out ndcg@10", "out/in", "% frozen in",
               "% frozen out", "train s"]
    rows = _merged(kept, rows)
    _rich_table(rows, columns)
    command = command_line()
    finish(args, rows, columns, {"folds": {**kept_folds, **folds},
                                 "config": {k: str(v) for k, v in vars(args).items()},
                                 **({"commands": [*commands, command]} if args.merge else {})})
    return 0



def _finetune_scores(folder: Path, source: str, data) -> tuple[str, dict, float, dict]:
    """Score a fold's fine-tune written by ``benchmarks/peers_finetune.py --eval-splits dev,test-in,test-out``.

    The epoch is the one with the best nDCG@10 on the fold's dev split (the five training sources); the extra
    columns give the chosen epoch, the same machine's frozen model on test-out and the paired bootstrap CI of
    the fine-tune minus that frozen model on test-out (per query, 10,000 resamples).
    """
    import json

    import numpy as np

    from medadapt.eval import evaluate_run
    from medadapt.eval.compare import paired_comparison, per_query_scores

    meta = json.loads((folder / "meta.json").read_text())
    tag = next(t for t in meta["runs"] if t != "frozen")
    info, ids = meta["runs"][tag], meta["doc_ids"][source]

    def run_of(z, split: str, epoch: int) -> dict:
        idx, sc = z[f"{source}.{split}.{epoch}.idx"], z[f"{source}.{split}.{epoch}.scores"]
        return {q: {ids[int(i)]: float(v) for i, v in zip(idx[j], sc[j])}
                for j, q in enumerate(meta["qids"][f"{source}.{split}"])}

    z, z0 = np.load(folder / f"{tag}.npz"), np.load(folder / "frozen.npz")
    dev = [evaluate_run(data.qrels["dev"], run_of(z, "dev", e), ["ndcg@10"])["ndcg@10"] for e in range(info["epochs"])]
    epoch = int(np.argmax(dev))
    scores = {s: evaluate_run(data.qrels[s], run_of(z, s, epoch), METRICS) for s in SPLITS}
    frozen_out = run_of(z0, "test-out", 0)
    c = paired_comparison(per_query_scores(data.qrels["test-out"], frozen_out, "ndcg@10"),
                          per_query_scores(data.qrels["test-out"], run_of(z, "test-out", epoch), "ndcg@10"))
    method = "full fine-tune" if tag.startswith("full") else "LoRA fine-tune (r 16)"
    extra = {"chosen": f"epoch {epoch + 1} of {info['epochs']}", "dev ndcg@10": round(float(dev[epoch]), 4),
             "device": meta["device"],
             "device frozen test-out ndcg@10": round(evaluate_run(data.qrels["test-out"], frozen_out,
                                                                  ["ndcg@10"])["ndcg@10"], 4),
             "test-out delta 95% CI": f"[{c.ci_low:+.3f}, {c.ci_high:+.3f}]"}
    seconds = info["train_seconds"] * (epoch + 1) / info["epochs"]
    return f"{method} (ST MNRL, bf16, GPU)", scores, seconds, extra


def _hybrid_row(row, recipe_path: Path, overrides: list[str], out: Path, fold: Path, source: str, data,
                cache, reference: dict, label: str, extra: dict | None = None) -> dict:
    """Train a recipe whose last section is a ``hyrec_lexical`` branch on ``fold`` and add its hybrid row, with
    the lexical-only and dense-only figures, the dense weight chosen on the fold's dev split and the branch's
    negatives in the JSON."""
    from medadapt.hyrec.data import SharedStateCache
    from medadapt.hyrec.evaluate import evaluate_modes
    from medadapt.recipes import load_recipe, run_recipe

    recipe = load_recipe(recipe_path, [f"data.path={fold}", "eval.split=test-in", "eval.expected={}", *overrides])
    section = recipe.branches[-1]
    t = time.perf_counter()
    res = run_recipe(recipe, out, cache=cache, show_progress=False, evaluate=False, overwrite=True,
                     log=lambda m: print(m, flush=True))
    wall = time.perf_counter() - t
    seconds = res.train_seconds or wall
    # the branch's own evaluation (hyrec.branch.evaluate): the frozen lexicon encoder's token states come from
    # the on-disk state cache the recipe trained with, the dense side from the embedding cache
    disk = section.training.state_cache == "disk"
    states = SharedStateCache(SharedStateCache.default_root()) if disk else None
    modes = {}
    for s in SPLITS:
        ev = section.eval.model_copy(update={"split": s, "metrics": METRICS, "modes": list(MODES_HY)})
        modes[s] = evaluate_modes(res.model, data, ev, cache=cache, state_cache=states, show_progress=False,
                                  cached_lexicon=disk)
    tuning = res.details.get("dense_weight_tuning", {})
    more = {f"{s} {mode} {m}": modes[s][mode][m] for mode in ("lexical", "dense") for s in SPLITS for m in METRICS}
    for mode in ("lexical", "dense"):
        for split, short in (("test-in", "in"), ("test-out", "out")):
            key = f"% frozen {short} {mode}"
            more[key] = round(100 * modes[split][mode]["ndcg@10"] / reference[split]["ndcg@10"], 1)
    more.update({"dense_weight": res.model.config.dense_weight, "dense_weight_tuning": tuning,
                 "branch negatives": section.negatives.model_dump(mode="json"), "wall s": round(wall, 1),
                 **(extra or {})})
    return row(label, source, {s: modes[s]["hybrid"] for s in SPLITS}, seconds, reference, more)


def _previous(args) -> tuple[list[dict], dict, list[str]]:
    """With ``--merge``: the rows, folds and commands of an existing ``--output`` (else nothing)."""
    if not (args.merge and args.output and args.output.is_file()):
        return [], {}, []
    import json

    old = json.loads(args.output.read_text())
    commands = old.get("commands") or ([old["command"]] if "command" in old else [])
    return old.get("rows", []), old.get("folds", {}), commands


def _merged(kept: list[dict], rows: list[dict]) -> list[dict]:
    """``kept`` without the (model, held-out source) pairs re-measured in ``rows``, then ``rows``."""
    new = {(r["model"], r["held-out source"]) for r in rows}
    return [r for r in kept if (r["model"], r["held-out source"]) not in new] + rows


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
