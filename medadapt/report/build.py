"""``build_report``: a run folder in, one HTML page out (see :mod:`medadapt.report`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from medadapt import __version__, systems
from medadapt.cache import EmbeddingCache
from medadapt.data import available_splits, load_beir, resolve_data_dir
from medadapt.errors import MedAdaptError
from medadapt.io import atomic_open, atomic_write_text
from medadapt.models import load
from medadapt.report import plots
from medadapt.report.analysis import analyse_retrieval
from medadapt.report.page import Figure, render
from medadapt.report.run_folder import RunFolder, read_run

__all__ = ["build_report"]

Log = Callable[[str], None]


def _loss_stages(run: RunFolder) -> tuple[dict[str, dict[str, list[tuple[int, float]]]], list[str]]:
    stages: dict[str, dict[str, list[tuple[int, float]]]] = {}
    parts: list[str] = []
    for row in run.loss_rows:
        stage = stages.setdefault(row.stage, {})
        for name, value in row.values.items():
            stage.setdefault(name, []).append((row.step, value))
            if name not in parts:
                parts.append(name)
    return stages, parts


def _expert_section(run: RunFolder, analysis) -> tuple[dict[str, Figure], dict[str, Any] | None, list[str]]:
    logged = run.expert_load()
    final, per_step = logged["final"], logged["per_step"]
    inference = analysis.expert_load if analysis is not None else {}
    figures: dict[str, Figure] = {}
    notes: list[str] = []
    names = final.get("names") or inference.get("names") or per_step.get("names")
    if not names:
        system = systems.find(run.kind)
        if system is not None and system.report_notes is not None:  # the system says why
            notes += system.report_notes(run, analysis)
        else:
            notes.append(f"Not a MoE head (recipe kind {run.kind!r}): no expert load to show.")
        return figures, None, notes
    series: dict[str, list[float]] = {}
    if final and len(final["load"]) == len(names):
        series["training (last stage)"] = final["load"]
    if inference.get("queries") and len(inference["queries"]) == len(names):
        series["eval queries"] = inference["queries"]
        series["eval documents"] = inference["documents"]
    elif analysis is None:
        notes.append("The expert load on the evaluation data needs the model and the data (see the notes "
                     "below).")
    if series:
        figures["load_bars"] = Figure(
            "expert-load", plots.expert_load_bars(names, series),
            "bar chart of the share of routing decisions per routed expert",
            "Share of top-k routing decisions each routed expert received: during the last training stage "
            "(train_log.json) and, recomputed with the trained model, on the evaluation queries and "
            "documents. The dashed line is a perfectly even load.")
    if per_step.get("rows"):
        figures["load_curves"] = Figure(
            "expert-load-steps", plots.expert_load_curves(per_step["names"], per_step["rows"]),
            "line chart of the expert load per training step",
            "Load of each routed expert per optimiser step of the routed stages (random routing, then the "
            "learned gate).")
    else:
        notes.append("train_log.json holds no per-step expert load (a run trained before medadapt logged it, "
                     "or on the backbone path): only the totals are shown.")
    table = {"columns": list(series), "rows": [{"name": f"{j}: {n}", "values": [series[c][j] for c in series]}
                                               for j, n in enumerate(names)]} if series else None
    return figures, table, notes


def _metric_rows(run: RunFolder) -> list[dict[str, Any]]:
    rows = []
    for metric in list(dict.fromkeys([*run.metrics, *run.baseline])):
        t, b = run.metrics.get(metric), run.baseline.get(metric)
        delta = t - b if t is not None and b is not None else None
        rows.append({"metric": metric, "trained": t, "base": b, "delta": delta,
                     "cls": "" if delta is None or abs(delta) < 5e-5 else ("gain" if delta > 0 else "loss")})
    return rows


def _load_data(run: RunFolder, data: str | Path | None, split: str | None, notes: list[str], log: Log):
    """``(dataset, name, split)``, or ``None`` with a note when the recipe's data cannot be found or read (an
    explicit ``data`` that cannot be read is an error)."""
    split = split or run.eval_split() or "test"
    name = str(data) if data is not None else run.data_path()
    if name is None:
        notes.append("The recipe names no evaluation data: pass --data DIR --split SPLIT for the score "
                     "distribution and the per-query comparison.")
        return None
    root = resolve_data_dir(name)
    if data is None and not root.is_dir():
        notes.append(f"The recipe's evaluation data {name!r} is not found from the current folder: pass "
                     "--data DIR for the score distribution and the per-query comparison.")
        return None
    if root.is_dir() and split not in available_splits(root):
        if data is not None:
            raise MedAdaptError(f"--data {data} has no split {split!r} (splits: "
                                f"{', '.join(available_splits(root)) or 'none'}); pass --split")
        notes.append(f"The recipe's evaluation data {name!r} has no split {split!r}: pass --split.")
        return None
    log(f"loading {name} / {split}")
    try:
        return load_beir(data if data is not None else root, [split]), name, split
    except MedAdaptError as exc:
        if data is not None:
            raise
        notes.append(f"The recipe's evaluation data {name!r} cannot be read ({exc}).")
        return None


def _analyse(run: RunFolder, data, split, cache, top_negatives, show_progress, log: Log, notes: list[str]):
    loaded = _load_data(run, data, split, notes, log)
    if loaded is None:
        return None
    dataset, name, split = loaded
    log(f"loading the trained model from {run.path}")
    try:
        model = load(str(run.path))
    except (MedAdaptError, OSError) as exc:
        notes.append(f"The trained model in this folder cannot be loaded ({exc}): no score distribution and "
                     "no per-query comparison.")
        return None
    try:
        analysis = analyse_retrieval(model, run, dataset, split, name, cache, num_negatives=top_negatives,
                                     show_progress=show_progress, log=log)
    except ValueError as exc:  # e.g. a similarity that inner-product search cannot serve
        notes.append(f"The retrieval analysis failed: {exc}.")
        return None
    return analysis


def _query_tables(analysis, top: int) -> list[tuple[str, list[Any]]]:
    rows = [r for r in analysis.rows if not math.isnan(r.base)]
    gained = sorted((r for r in rows if r.delta > 1e-9), key=lambda r: (-r.delta, r.qid))[:top]
    lost = sorted((r for r in rows if r.delta < -1e-9), key=lambda r: (r.delta, r.qid))[:top]
    return [(f"Gained most (top {top})", gained), (f"Lost most (top {top})", lost)]


def build_report(run_dir: str | Path, output: str | Path | None = None, *, data: str | Path | None = None,
                 split: str | None = None, cache=None, top: int = 10, top_negatives: int = 5,
                 images_dir: str | Path | None = None, show_progress: bool = True,
                 log: Log = lambda _m: None) -> Path:
    """Write the HTML report of the run folder ``run_dir`` (default ``<run_dir>/report.html``, atomically) and
    return its path.

    Args:
        data / split: BEIR data and split for the score distribution, the per-query comparison and the
            expert load at inference (default: the recipe's evaluation data and split).
        top: rows in each of the "gained most" / "lost most" tables.
        top_negatives: hard negatives per query in the score distribution.
        images_dir: also write every figure there as a PNG (the page embeds them either way).

    Raises:
        MedAdaptError: not a run folder; ``data`` cannot be read or lacks ``split``; the output cannot be
            written. Missing optional pieces become notes on the page.
    """
    if top < 1 or top_negatives < 1:
        raise MedAdaptError("top and top_negatives must be at least 1")
    run = read_run(run_dir)
    output = Path(output) if output is not None else run.path / "report.html"
    if output.is_dir():
        raise MedAdaptError(f"cannot write {output}: it is an existing folder (give a file path)")
    cache = cache if cache is not None else EmbeddingCache()
    figures: dict[str, Figure] = {}

    stages, parts = _loss_stages(run)
    if stages:
        log("plotting the training curves")
        figures["loss"] = Figure("loss", plots.loss_curves(stages), "training loss curves per stage",
                                 "Loss per optimiser step, one panel per stage; thin lines are the raw "
                                 "values, thick ones a running mean where there are many steps.")

    analysis_notes: list[str] = []
    analysis = _analyse(run, data, split, cache, top_negatives, show_progress, log, analysis_notes)
    if analysis is not None:
        analysis_notes += analysis.notes

    load_figures, load_table, expert_notes = _expert_section(run, analysis)
    figures.update(load_figures)

    score_table = []
    if analysis is not None and analysis.scores:
        panels = {k: v for k, v in analysis.scores.items() if len(v[0]) and len(v[1])}
        figures["scores"] = Figure(
            "scores", plots.score_histograms(panels), "histograms of positive and hard-negative similarities",
            f"Similarity of each query of {analysis.data} / {analysis.split} to its relevant documents "
            f"(positives) and to its {top_negatives} highest-ranked non-relevant documents under the "
            f"{analysis.negatives_from} (hard negatives; the same pairs for every panel).")
        score_table = [{"model": k, "pos": float(v[0].mean()), "neg": float(v[1].mean())}
                       for k, v in panels.items()]

    metric_table = _metric_rows(run)
    if run.metrics and run.baseline:
        common = [m for m in run.metrics if m in run.baseline]
        if common:
            figures["metrics"] = Figure("metrics", plots.metrics_bars(common, {"frozen base": run.baseline,
                                                                               "trained": run.metrics}),
                                        "bar chart of the metrics of the frozen base and the trained model")

    query_tables: list[tuple[str, list[Any]]] = []
    queries_note = ("Needs the trained model, the frozen base model and the evaluation data (see the notes "
                    "above).")
    if analysis is not None and analysis.rows and not all(math.isnan(r.base) for r in analysis.rows):
        query_tables = _query_tables(analysis, top)
        base = np.array([r.base for r in analysis.rows])
        trained = np.array([r.trained for r in analysis.rows])
        figures["per_query"] = Figure("per-query", plots.per_query_scatter(base, trained, "nDCG@10"),
                                      "scatter plot of per-query nDCG@10, frozen base against trained")

    ev_data, ev_split = run.data_path(), run.eval_split()
    facts = []
    for key, label in (("train_seconds", "training {:.0f} s"), ("encode_seconds", "encoding {:.0f} s")):
        value = run.log.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            facts.append(label.format(value))
    if isinstance(run.log.get("stage_steps"), dict):
        facts.append("steps " + ", ".join(f"{k} {v}" for k, v in run.log["stage_steps"].items()))
    if run.log.get("adapter_only") is True:
        facts.append("adapter-only folder")
    context = {
        "version": __version__, "run": run, "run_path": str(run.path), "facts": facts, "figures": figures,
        "loss_parts": parts, "expert_notes": expert_notes, "load_table": load_table,
        "analysis_notes": analysis_notes, "score_table": score_table, "metric_table": metric_table,
        "eval_where": f"{ev_data or '?'} / {ev_split or '?'}",
        "analysis_where": f"{analysis.data} / {analysis.split}" if analysis is not None else "",
        "analysis_means": analysis.means if analysis is not None else {},
        "query_tables": query_tables, "queries_note": queries_note,
    }
    html_text = render(context)
    if images_dir is not None:
        images_dir = Path(images_dir)
        for fig in figures.values():
            with atomic_open(images_dir / f"{fig.name}.png", "wb") as f:
                f.write(fig.png)
    atomic_write_text(output, html_text)
    log(f"wrote {output}")
    return output
