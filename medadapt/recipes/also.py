"""More evaluation sets after training (``eval.also``): "no harm outside the domain".

For each set the runner scores the frozen base and the trained model with the kind's own evaluation (the
recipe's ``eval`` pointed at the set) through the run's cache. Here: checking the sets before training,
pointing a recipe at a set, the ``base`` / ``trained`` / ``delta`` rows and their warning lines.
"""

from __future__ import annotations

from collections.abc import Callable

from medadapt.data.beir import load_beir
from medadapt.errors import ConfigError, MedAdaptError
from medadapt.recipes.base import AlsoSection, RecipeBase

__all__ = ["as_modes", "check_also_sets", "compare", "eval_set_name", "evaluate_also_sets", "metric_label",
           "peer_warning", "peers_as_modes", "primary_key", "redirect", "regression_warning", "served_key"]

_LABELS = {"ndcg": "nDCG", "mrr": "MRR", "map": "MAP", "recall": "Recall", "precision": "P", "f1": "F1",
           "accuracy": "Accuracy"}


def check_also_sets(recipe: RecipeBase) -> None:
    """Load every ``eval.also`` set so that a missing folder or split is one :class:`ConfigError` before training."""
    for entry in recipe.eval.also:
        try:
            load_beir(recipe.resolve(entry.data), [entry.split])
        except MedAdaptError as exc:
            raise ConfigError(f"eval.also {entry.name}: {exc}") from None


def redirect(recipe: RecipeBase, entry: AlsoSection) -> RecipeBase:
    """A copy of ``recipe`` whose ``eval`` reads ``entry``'s data and split (every other eval setting kept)."""
    ev = recipe.eval.model_copy(update={"data": entry.data, "split": entry.split, "also": []})
    return recipe.model_copy(update={"eval": ev})


def as_modes(trained: dict[str, float], base: dict[str, float]) -> dict[str, float]:
    """``base`` beside a hybrid model's per-mode metrics (``dense/…``, ...): a plain base is a dense model, what
    a user serves without the trained model, so its metrics stand beside both the ``dense/`` and the served
    ``hybrid/`` rows (not the ``lexical/`` ones); otherwise ``base`` as it is."""
    if trained and all("/" in k for k in trained) and not any("/" in k for k in base):
        modes = [m for m in ("dense", "hybrid") if any(k.startswith(f"{m}/") for k in trained)]
        return {f"{m}/{k}": v for m in modes for k, v in base.items()}
    return dict(base)


def compare(trained: dict[str, float], base: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{"base", "trained", "delta": trained - base}`` (on the keys both have, the base by :func:`as_modes`)."""
    base = as_modes(trained, base)
    return {"base": base, "trained": dict(trained),
            "delta": {k: trained[k] - base[k] for k in trained if k in base}}


def primary_key(row: dict[str, dict[str, float]], metric: str) -> str | None:
    """The key of ``metric`` in ``row``'s delta (:func:`served_key`)."""
    return served_key(row.get("delta", {}), metric)


def served_key(keys, metric: str) -> str | None:
    """``metric`` among ``keys``: itself, else ``hybrid/<metric>`` (a composed model is served in hybrid mode),
    else the first ``<mode>/<metric>``; ``None`` if none."""
    for key in (metric, f"hybrid/{metric}"):
        if key in keys:
            return key
    return next((k for k in keys if k.rsplit("/", 1)[-1] == metric), None)


def metric_label(key: str) -> str:
    """``ndcg@10`` -> ``nDCG@10``, ``dense/mrr@10`` -> ``dense/MRR@10`` (other names as they are)."""
    head, _, name = key.rpartition("/")
    base, at, k = name.partition("@")
    name = f"{_LABELS.get(base, base)}{at}{k}"
    return f"{head}/{name}" if head else name


def regression_warning(label: str, row: dict[str, dict[str, float]], metric: str) -> str | None:
    """The warning line when the trained model's ``metric`` is below the base's on set ``label``, else ``None``."""
    key = primary_key(row, metric)
    if key is None or not row["delta"][key] < 0:
        return None
    t, b, d = row["trained"][key], row["base"][key], row["delta"][key]
    return (f"warning: trained model is below the frozen base on {label}: {metric_label(key)} {t:.4f} < "
            f"{b:.4f} ({d:+.4f})")


def evaluate_also_sets(recipe: RecipeBase, score_trained: Callable[[RecipeBase], dict[str, float]],
                       score_base: Callable[[RecipeBase], dict[str, float]]
                       ) -> dict[str, dict[str, dict[str, float]]]:
    """``{set name: {"base", "trained", "delta"}}`` for every ``eval.also`` set: the trained model first (a base
    sharing its document side then reads the corpus from the cache)."""
    out = {}
    for entry in recipe.eval.also:
        pointed = redirect(recipe, entry)
        out[entry.name] = compare(score_trained(pointed), score_base(pointed))
    return out


def eval_set_name(recipe: RecipeBase) -> str:
    """The recipe's own evaluation set named as ``eval.also`` names its sets, e.g. ``medquad-mini/test``."""
    return AlsoSection.model_construct(data=recipe.eval.data or recipe.data.path, split=recipe.eval.split).name


def peer_warning(peer: str, label: str, trained: dict[str, float], scores: dict[str, float],
                 metric: str) -> str | None:
    """The warning line when peer baseline ``peer`` beats the trained model on ``metric`` on set ``label``, else
    ``None``."""
    key = served_key(trained, metric)
    theirs = scores.get(metric, scores.get(f"dense/{metric}"))  # a peer is a dense model
    if key is None or theirs is None or not theirs > trained[key]:
        return None
    return (f"warning: the {peer} trained in this run beats the head on {label}: {metric_label(key)} "
            f"{theirs:.4f} > {trained[key]:.4f}")


def peers_as_modes(metrics: dict[str, float], also: dict[str, dict[str, dict[str, float]]],
                   peers: dict[str, dict]) -> dict[str, dict]:
    """``peers`` with their (dense) metrics keyed as ``metrics`` and each ``also`` set's are (:func:`as_modes`),
    so a composed model's card shows a peer beside its ``dense/`` rows."""
    return {label: {**row, "metrics": as_modes(metrics, row["metrics"]),
                    "also": {name: as_modes(also.get(name, {}).get("trained", {}), scores)
                             for name, scores in row.get("also", {}).items()}}
            for label, row in peers.items()}
