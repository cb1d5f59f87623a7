"""Paired comparison of two retrieval runs on the same queries: is B's gain over A real?

Both runs are scored per query (:func:`medadapt.eval.metrics.per_query_values`, ``ndcg@10`` by default), then
the mean difference ``B - A``, its **paired bootstrap** confidence interval (queries resampled with
replacement, seeded; numpy), the **paired t-test** p-value (scipy) and wins / ties / losses. Runs are TREC run
files, JSON files ``{"qid": {"docid": score}}`` or run dicts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from medadapt.data import load_beir
from medadapt.data.text import decode_json
from medadapt.errors import DataError, MedAdaptError
from medadapt.eval.metrics import Qrels, Run, parse_metric
from medadapt.eval.metrics import per_query_values as per_query_scores
from medadapt.eval.tasks.base import evaluate
from medadapt.eval.tasks.retrieval import RetrievalTask
from medadapt.io import atomic_write_json
from medadapt.models import load

__all__ = ["PairedComparison", "compare_runs", "comparison_table", "paired_comparison", "per_query_scores",
           "read_run"]


@dataclass
class PairedComparison:
    """The outcome of :func:`paired_comparison` (``difference`` is B minus A)."""

    metric: str
    queries: int
    mean_a: float
    mean_b: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    wins: int
    ties: int
    losses: int
    n_resamples: int
    seed: int
    names: tuple[str, str] = ("A", "B")
    per_query: dict[str, tuple[float, float]] = field(default_factory=dict, repr=False)

    @property
    def significant(self) -> bool:
        """The confidence interval excludes 0."""
        return self.ci_low > 0 or self.ci_high < 0

    def to_dict(self, per_query: bool = False) -> dict:
        out = asdict(self)
        out["names"] = list(self.names)
        out["significant"] = self.significant
        if per_query:
            out["per_query"] = {q: {"a": a, "b": b} for q, (a, b) in self.per_query.items()}
        else:
            out.pop("per_query")
        return out


def paired_comparison(scores_a: dict[str, float], scores_b: dict[str, float], *, metric: str = "ndcg@10",
                      n_resamples: int = 10_000, seed: int = 0, confidence: float = 0.95,
                      tie_tolerance: float = 1e-9, names: tuple[str, str] = ("A", "B")) -> PairedComparison:
    """Compare per-query scores of two systems on the same queries (both dicts must hold the same ids)."""
    if set(scores_a) != set(scores_b):
        only = sorted(set(scores_a) ^ set(scores_b))[:5]
        raise DataError(f"the two runs are scored on different queries (e.g. {only})")
    if not scores_a:
        raise DataError("no queries to compare")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    qids = sorted(scores_a)
    a = np.array([scores_a[q] for q in qids], dtype=np.float64)
    b = np.array([scores_b[q] for q in qids], dtype=np.float64)
    diff = b - a
    n = len(qids)
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples, dtype=np.float64)
    chunk = max(1, 2_000_000 // n)
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = diff[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha])
    p_value = _paired_t_p(a, b)
    return PairedComparison(
        metric=metric, queries=n, mean_a=float(a.mean()), mean_b=float(b.mean()), difference=float(diff.mean()),
        ci_low=float(low), ci_high=float(high), confidence=confidence, p_value=p_value,
        wins=int((diff > tie_tolerance).sum()), ties=int((np.abs(diff) <= tie_tolerance).sum()),
        losses=int((diff < -tie_tolerance).sum()), n_resamples=n_resamples, seed=seed, names=tuple(names),
        per_query={q: (float(x), float(y)) for q, x, y in zip(qids, a, b)})


def _paired_t_p(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided paired t-test p-value (scipy); 1.0 when every difference is 0 and 0.0 when every difference
    is the same non-zero value (scipy gives NaN / a warning there; JSON must not hold NaN)."""
    diff = b - a
    if len(diff) < 2 or np.all(diff == diff[0]):
        return 1.0 if len(diff) < 2 or diff[0] == 0 else 0.0
    from scipy.stats import ttest_rel

    p = float(ttest_rel(b, a).pvalue)
    return p if np.isfinite(p) else 1.0


def compare_runs(qrels: Qrels, run_a: Run, run_b: Run, metric: str = "ndcg@10", **kwargs) -> PairedComparison:
    """:func:`paired_comparison` of two runs' per-query ``metric`` on ``qrels``."""
    return paired_comparison(per_query_scores(qrels, run_a, metric), per_query_scores(qrels, run_b, metric),
                             metric=metric, **kwargs)


def read_run(path: str | Path) -> Run:
    """A run from a TREC run file (``qid Q0 docid rank score tag``, whitespace separated) or a JSON file
    ``{"qid": {"docid": score}}``. A repeated (query, document) pair or a malformed line is refused with
    ``file:line``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if text.lstrip().startswith("{"):
        data = decode_json(text, path)  # bad JSON, depth, huge numbers, duplicate keys, lone surrogates
        if not isinstance(data, dict):
            raise DataError(f"{path}: expected a JSON object {{qid: {{docid: score}}}}")
        run: Run = {}
        for qid, docs in data.items():
            if not isinstance(docs, dict):
                raise DataError(f"{path}: query {qid!r}: expected {{docid: score}}")
            try:
                run[str(qid)] = {str(d): _finite(s, path, qid) for d, s in docs.items()}
            except (TypeError, ValueError):
                raise DataError(f"{path}: query {qid!r}: scores must be finite numbers") from None
        return run
    run = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise DataError(f"{path}:{lineno}: expected 6 columns (qid Q0 docid rank score tag), got {len(parts)}")
        qid, _, did, _, score, _ = parts
        try:
            value = _finite(score, path, qid)
        except ValueError:
            raise DataError(f"{path}:{lineno}: score {score!r} is not a finite number") from None
        docs = run.setdefault(qid, {})
        if did in docs:
            raise DataError(f"{path}:{lineno}: document {did!r} appears twice for query {qid!r}")
        docs[did] = value
    if not run:
        raise DataError(f"{path}: the run is empty")
    return run


def _finite(value, path, qid) -> float:
    x = float(value)
    if not np.isfinite(x):
        raise ValueError(f"{path}: query {qid!r}: non-finite score")
    return x


def comparison_table(result: PairedComparison, title: str | None = None):
    """A rich ``Table`` of the comparison (``rich.text.Text`` cells: run names are never read as markup)."""
    from rich.table import Table
    from rich.text import Text

    a, b = result.names
    table = Table(title=Text(title or f"paired comparison, {result.metric} ({result.queries} queries)"))
    table.add_column("")
    table.add_column("value", justify="right")
    pct = f"{result.confidence:.0%}"
    rows = [(f"{result.metric} A ({a})", f"{result.mean_a:.4f}"), (f"{result.metric} B ({b})", f"{result.mean_b:.4f}"),
            ("difference B - A", f"{result.difference:+.4f}"),
            (f"bootstrap {pct} CI ({result.n_resamples:,} resamples)", f"[{result.ci_low:+.4f}, {result.ci_high:+.4f}]"),
            ("paired t-test p-value", f"{result.p_value:.4g}"),
            ("wins / ties / losses (B vs A)", f"{result.wins} / {result.ties} / {result.losses}"),
            ("significant (CI excludes 0)", "yes" if result.significant else "no")]
    for label, value in rows:
        table.add_row(Text(label), Text(value))  # "[-0.01, +0.02]" is a value, not markup
    return table


def _run_of(source: str, data, split: str, metric: str, mode: str | None, *, device, cache, batch_size: int,
            quiet: bool) -> Run:
    """The run of ``source``: a run file (TREC or JSON), else a model (alias, folder, hub id) scored on ``data``
    as ``medadapt eval --mode`` scores it (``mode=None``: the model's own default, e.g. hybrid for a model with
    a learned-lexical side), through the embedding cache."""
    path = Path(source).expanduser()
    if path.is_file():
        return read_run(path)
    task = RetrievalTask.create(Path(str(data.root or 'data')).name).load_data(data, split)
    runs: list = []
    evaluate(load(source, device=device), task, metrics=[metric], mode=mode, cache=cache, batch_size=batch_size,
             show_progress=not quiet, runs=runs)
    return runs[-1]


def cli_compare(runs: tuple[str, str], data: str, split: str, metrics: str | None, output: Path | None, *,
                cache, device=None, batch_size: int = 64, quiet: bool = False, console=None,
                n_resamples: int = 10_000, seed: int = 0, mode: str | None = None) -> PairedComparison:
    """``medadapt eval --compare RUN_A RUN_B --data DIR --split S [--mode M]``: the comparison table, and the JSON
    (:meth:`PairedComparison.to_dict` with the per-query scores) with ``--output``. A model side is scored in
    ``mode`` (default: its own, so a composed model in hybrid mode beside a dense one in dense mode)."""
    wanted = [m.strip() for m in metrics.split(",") if m.strip()] if metrics else ["ndcg@10"]
    if len(wanted) != 1:
        raise MedAdaptError("--compare takes one metric (--metrics ndcg@10, the default)")
    try:
        parse_metric(wanted[0], per_query=True)
    except ValueError as exc:
        raise MedAdaptError(str(exc)) from None
    dataset = load_beir(data, [split])
    qrels = dataset.qrels[split]
    found = [_run_of(r, dataset, split, wanted[0], mode, device=device, cache=cache, batch_size=batch_size,
                     quiet=quiet) for r in runs]
    judged = [r for r in found if set(r) & set(qrels)]
    if len(judged) < 2:
        raise MedAdaptError(f"a run shares no query id with the qrels of split {split!r} of {data}")
    names = tuple(Path(r).name or r for r in runs)
    result = compare_runs(qrels, found[0], found[1], wanted[0], n_resamples=n_resamples, seed=seed, names=names)
    if console is not None:
        console.print(comparison_table(result, title=f"{names[1]} vs {names[0]} on {Path(data).name or data}/{split}"
                                                     f": {result.metric}, {result.queries} queries"))
    if output:
        atomic_write_json(output, result.to_dict(per_query=True))
        if console is not None:
            console.print(f"wrote {output}")
    return result
