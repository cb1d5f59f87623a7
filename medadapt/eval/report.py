"""Results as a CMedTEB-style table (rich), JSON, and a bar plot (matplotlib, extra ``[plot]``)."""

from __future__ import annotations

from pathlib import Path

from medadapt.errors import MedAdaptError
from medadapt.io import atomic_open, atomic_write_json

Results = dict[str, float]


def results_table(results: dict[str, Results], task: str, title: str | None = None):
    """A rich ``Table`` with one row per (model/dataset, metric). Names are ``rich.text.Text``: printed
    literally on any console (a run named ``[/bold]`` is no markup)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=None if title is None else Text(title), show_lines=False)
    table.add_column("task")
    table.add_column("run")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for run_name, metrics in results.items():
        for metric, value in metrics.items():
            table.add_row(Text(task), Text(run_name), Text(metric), f"{value:.4f}")
    return table


def write_json(path: str | Path, metrics: Results) -> None:
    """Write metrics as a flat JSON object ``{"ndcg@10": 0.57, ...}`` atomically."""
    atomic_write_json(path, {k: round(float(v), 6) for k, v in metrics.items()})


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, or one error naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MedAdaptError("plotting needs matplotlib: pip install 'medadapt[plot]'") from exc
    return plt


def plot_results(results: dict[str, Results], path: str | Path, title: str = "") -> Path:
    """Grouped bar chart: one group per metric, one bar per run. Written atomically as PNG."""
    plt = pyplot()
    runs = list(results)
    metrics = list(dict.fromkeys(m for r in results.values() for m in r))
    width = 0.8 / max(len(runs), 1)
    fig, ax = plt.subplots(figsize=(max(4, 1.3 * len(metrics) + 2), 3.5))
    for i, run in enumerate(runs):
        xs = [j + i * width for j in range(len(metrics))]
        ax.bar(xs, [results[run].get(m, 0.0) for m in metrics], width=width, label=run)
    ax.set_xticks([j + width * (len(runs) - 1) / 2 for j in range(len(metrics))], metrics)
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.legend(fontsize="small")
    return save_figure(fig, path)


def save_figure(fig, path: str | Path) -> Path:
    """Lay out ``fig``, write it as a PNG to ``path`` atomically and close it."""
    fig.tight_layout()
    path = Path(path)
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)
    pyplot().close(fig)
    return path
