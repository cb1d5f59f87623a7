"""A suite's results as a rich table, JSON (atomic) and a grouped bar plot (matplotlib, atomic PNG)."""

from __future__ import annotations

from pathlib import Path

from medadapt.eval.report import pyplot, save_figure
from medadapt.eval.suites.base import SuiteResult
from medadapt.io import atomic_write_json

__all__ = ["plot_suite", "suite_table", "write_suite_json"]


def suite_table(result: SuiteResult, title: str | None = None):
    """One row per task and query language (main score first, then the other metrics), then the averages.
    Names are ``rich.text.Text``: printed literally on any console (never read as markup)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=Text(title or f"{result.title}: {result.model} on {result.split}"))
    if result.instructions:  # whether the papers' instructions were applied, and why
        how = result.instructions
        table.caption = Text(f"instructions {'on' if how.get('applied') else 'off'} ({how.get('mode')}): "
                             f"{how.get('reason', '')}")
    for col, kw in (("task", {}), ("family", {}), ("queries->corpus", {}), ("main metric", {}),
                    ("score", {"justify": "right"}), ("other metrics", {})):
        table.add_column(col, **kw)
    for r in result.rows:
        others = "  ".join(f"{k} {v:.4f}" for k, v in r.metrics.items() if k != r.main_metric)
        table.add_row(Text(r.task), Text(r.family), Text(f"{r.query_language}->{r.corpus_language}"),
                      Text(r.main_metric), f"{r.main_score:.4f}", Text(others))
    if result.averages:
        table.add_section()
        for name, value in result.averages.items():
            table.add_row(Text(f"average {name}"), "", "", "", "n/a" if value is None else f"{value:.4f}",
                          Text(result.average_definitions.get(name, "")))
    return table


def write_suite_json(path: str | Path, result: SuiteResult) -> None:
    atomic_write_json(path, result.to_dict())


def plot_suite(result: SuiteResult, path: str | Path) -> Path:
    """Main score per task (one bar per query language where a task has several, e.g. CURE's en / es / fr),
    with the suite's averages as dashed lines where there are few."""
    plt = pyplot()
    tasks = list(dict.fromkeys(r.task for r in result.rows))
    langs = list(dict.fromkeys(r.query_language for r in result.rows))
    width = 0.8 / max(len(langs), 1)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(tasks) + 2), 4.0))
    for i, lang in enumerate(langs):
        xs, ys = [], []
        for j, task in enumerate(tasks):
            match = [r for r in result.rows if r.task == task and r.query_language == lang]
            if match:
                xs.append(j + i * width)
                ys.append(match[0].main_score)
        label = f"{lang} queries" if len(langs) > 1 else None
        ax.bar(xs, ys, width=width, label=label, color=colors[i % len(colors)])
    ax.set_xticks([j + width * (len(langs) - 1) / 2 for j in range(len(tasks))], tasks, rotation=35, ha="right",
                  fontsize="small")
    mains = sorted({r.main_metric for r in result.rows})
    if len(langs) > 1:  # per-language averages of the main metric (CURE's ndcg@10/en ...), in the bars' colours
        lines = [(f"{mains[0]}/{lang}", colors[i % len(colors)]) for i, lang in enumerate(langs)]
    else:
        lines = [(k, "gray") for k in result.averages][:3]
    for (name, color), style in zip(lines, ("--", ":", "-.")):
        value = result.averages.get(name)
        if value is not None:
            ax.axhline(value, linestyle=style if len(langs) == 1 else "--", linewidth=1.0, color=color,
                       label=f"average {name} {value:.3f}")
    ax.set_ylabel(" / ".join(mains))
    ax.set_ylim(min(0.0, min((r.main_score for r in result.rows), default=0.0)), 1)
    ax.set_title(f"{result.title}: {result.model}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not over, the bars
    return save_figure(fig, path)
