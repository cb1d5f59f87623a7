"""The report's figures as PNG bytes (matplotlib's object API with the Agg canvas: no pyplot state, no global
backend switch)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from medadapt.errors import MedAdaptError

__all__ = ["expert_load_bars", "expert_load_curves", "loss_curves", "metrics_bars", "per_query_scatter",
           "score_histograms"]

_DPI = 100


def _figure(width: float, height: float):
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:  # pragma: no cover - depends on the environment
        raise MedAdaptError("the run report needs matplotlib: pip install 'medadapt[plot]'") from None
    fig = Figure(figsize=(width, height), dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig


def _png(fig) -> bytes:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def _smooth(values: np.ndarray) -> np.ndarray | None:
    """A running mean over ~5% of the points (``None`` under 40 points: the raw line suffices)."""
    n = len(values)
    if n < 40:
        return None
    w = max(2, n // 20)
    padded = np.concatenate([np.full(w - 1, values[0]), values])
    return np.convolve(padded, np.ones(w) / w, mode="valid")


def _curve(ax, xs: np.ndarray, ys: np.ndarray, lw: float, smooth_lw: float, **kwargs) -> None:
    """The raw line, faint when a running mean is drawn over it in the same colour."""
    smooth = _smooth(ys)
    line = ax.plot(xs, ys, lw=lw, alpha=0.35 if smooth is not None else 1.0, **kwargs)[0]
    if smooth is not None:
        ax.plot(xs, smooth, lw=smooth_lw, color=line.get_color())


def _steps_axis(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _grouped_bars(ax, groups: Sequence[str], series: dict[str, Sequence[float]], **bar_kwargs) -> None:
    """One group of bars per entry of ``groups``, one bar per series."""
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        bars = ax.bar(np.arange(len(groups)) + i * width, values, width=width, label=label)
        if bar_kwargs:
            ax.bar_label(bars, **bar_kwargs)
    ax.set_xticks(np.arange(len(groups)) + width * (len(series) - 1) / 2, list(groups), fontsize=8)
    ax.grid(axis="y", alpha=0.3)


def loss_curves(stages: dict[str, dict[str, list[tuple[int, float]]]]) -> bytes:
    """One panel per stage (stage -> part -> ``[(step, value), ...]``): the total ``loss`` (bold) and every
    named part against the global step."""
    n = len(stages)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig = _figure(4.6 * cols, 3.2 * rows)
    for i, (stage, parts) in enumerate(stages.items()):
        ax = fig.add_subplot(rows, cols, i + 1)
        for name, points in parts.items():
            main = name == "loss"
            _curve(ax, np.array([p[0] for p in points], dtype=float), np.array([p[1] for p in points], dtype=float),
                   1.8 if main else 1.0, 1.8 if main else 1.2, label=name, color="black" if main else None)
        ax.set_title(f"stage: {stage}", fontsize=10)
        _steps_axis(ax)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    return _png(fig)


def expert_load_bars(names: Sequence[str], series: dict[str, Sequence[float]]) -> bytes:
    """The share of routing decisions each routed expert got, one bar per series, with the uniform share."""
    k = len(names)
    fig = _figure(max(4.5, 1.1 * k + 2.5), 3.3)
    ax = fig.add_subplot(1, 1, 1)
    _grouped_bars(ax, [f"{j}: {name}" for j, name in enumerate(names)], series)
    ax.axhline(1.0 / k, ls="--", color="gray", lw=1, label="uniform")
    ax.set_ylabel("share of routing decisions")
    ax.legend(fontsize="small")
    return _png(fig)


def expert_load_curves(names: Sequence[str], rows: Sequence[dict[str, Any]]) -> bytes:
    """Per-step load of each routed expert during the routed stages (stage changes marked)."""
    fig = _figure(7.5, 3.3)
    ax = fig.add_subplot(1, 1, 1)
    steps = np.array([r["step"] for r in rows], dtype=float)
    load = np.array([r["load"] for r in rows], dtype=float)
    for j, name in enumerate(names):
        _curve(ax, steps, load[:, j], 1, 1.5, label=f"{j}: {name}")
    ax.axhline(1.0 / len(names), ls="--", color="gray", lw=1)
    previous = None
    for r in rows:
        if r["stage"] != previous:
            ax.axvline(r["step"], color="black", lw=0.6, alpha=0.5)
            ax.annotate(r["stage"], (r["step"], 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                        va="top", ha="left")
            previous = r["stage"]
    _steps_axis(ax)
    ax.set_ylabel("share of routing decisions")
    ax.legend(fontsize="small", ncol=2)
    ax.grid(alpha=0.3)
    return _png(fig)


def score_histograms(panels: dict[str, tuple[np.ndarray, np.ndarray]]) -> bytes:
    """One panel per model: overlaid histograms (shared bins) of the similarity of each query to its relevant
    documents and to its hard negatives."""
    every = np.concatenate([np.concatenate(v) for v in panels.values()])
    lo, hi = float(every.min()), float(every.max())
    bins = np.linspace(lo, hi if hi > lo else lo + 1e-3, 41)
    fig = _figure(4.6 * len(panels), 3.2)
    for i, (title, (pos, neg)) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), i + 1)
        ax.hist(neg, bins=bins, alpha=0.55, density=True, label=f"hard negatives ({len(neg)})",
                color="tab:red")
        ax.hist(pos, bins=bins, alpha=0.55, density=True, label=f"positives ({len(pos)})", color="tab:green")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("similarity")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    return _png(fig)


def metrics_bars(metrics: Sequence[str], series: dict[str, dict[str, float]]) -> bytes:
    """One group of bars per metric, one bar per model (frozen base, trained)."""
    fig = _figure(max(4.5, 1.4 * len(metrics) + 2), 3.3)
    ax = fig.add_subplot(1, 1, 1)
    _grouped_bars(ax, metrics, {label: [values.get(m, np.nan) for m in metrics] for label, values in series.items()},
                  fmt="%.3f", fontsize=7)
    ax.set_ylim(0, 1.08)
    ax.legend(fontsize="small", loc="lower right")
    return _png(fig)


def per_query_scatter(base: np.ndarray, trained: np.ndarray, metric: str) -> bytes:
    """Per-query ``metric`` of the frozen base (x) against the trained model (y); points above the diagonal
    gained."""
    fig = _figure(4.2, 4.0)
    ax = fig.add_subplot(1, 1, 1)
    delta = trained - base
    colors = np.where(delta > 1e-9, "tab:green", np.where(delta < -1e-9, "tab:red", "tab:gray"))
    jitter = np.random.default_rng(0).uniform(-0.006, 0.006, size=(2, len(base)))  # identical points stay visible
    ax.scatter(base + jitter[0], trained + jitter[1], s=9, c=colors, alpha=0.6, linewidths=0)
    ax.plot([0, 1], [0, 1], color="black", lw=0.8)
    ax.set_xlim(-0.03, 1.03)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel(f"frozen base {metric}")
    ax.set_ylabel(f"trained {metric}")
    ax.set_title(f"{int((delta > 1e-9).sum())} gained, {int((delta < -1e-9).sum())} lost, "
                 f"{int((np.abs(delta) <= 1e-9).sum())} equal", fontsize=9)
    ax.grid(alpha=0.3)
    return _png(fig)
