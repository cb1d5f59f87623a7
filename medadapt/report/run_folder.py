"""Reading a run folder written by ``medadapt train`` (``recipe.yaml``, ``train_log.json``, ``metrics.json``,
``baseline_metrics.json``) for the report, tolerantly: a missing or unreadable optional file becomes a note,
never an error. Only a folder that is not a run at all (no ``recipe.yaml`` / ``train_log.json``) is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from medadapt.errors import MedAdaptError
from medadapt.yaml_input import read_yaml

__all__ = ["LossRow", "RunFolder", "read_run"]

#: keys of a ``loss_history`` row that are not loss parts
_NOT_PARTS = ("stage", "step", "epoch", "lr")


@dataclass(frozen=True)
class LossRow:
    """One logged optimiser step: its stage, global step, and the named loss values (``loss`` and parts)."""

    stage: str
    step: int
    values: dict[str, float]
    lr: float | None = None


@dataclass
class RunFolder:
    """What the report reads from a run folder.

    Attributes:
        path: the folder.
        name / description / kind: from ``recipe.yaml``.
        recipe: the whole saved recipe (a plain dict).
        log: ``train_log.json`` (a dict).
        loss_rows: the ``loss_history`` rows with finite numeric values only.
        metrics / baseline: ``metrics.json`` / ``baseline_metrics.json`` (empty when absent).
        notes: what was missing or unreadable, for the page.
    """

    path: Path
    name: str
    description: str
    kind: str
    recipe: dict[str, Any]
    log: dict[str, Any]
    loss_rows: list[LossRow] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def data_path(self) -> str | None:
        """The evaluation data the recipe names (``eval.data``, else ``data.path``), as written."""
        ev = self.recipe.get("eval") if isinstance(self.recipe.get("eval"), dict) else {}
        data = self.recipe.get("data") if isinstance(self.recipe.get("data"), dict) else {}
        value = ev.get("data") or data.get("path")
        return value if isinstance(value, str) and value else None

    def eval_split(self) -> str | None:
        ev = self.recipe.get("eval") if isinstance(self.recipe.get("eval"), dict) else {}
        split = ev.get("split")
        return split if isinstance(split, str) and split else None

    def expert_load(self) -> dict[str, Any]:
        """The MoE expert load the training logged: ``routing_stats`` (the last stage's load per routed
        expert) and ``expert_load`` (per step), each ``{}`` when absent or malformed."""
        return {"final": _routing_stats(self.log.get("routing_stats")),
                "per_step": _load_rows(self.log.get("expert_load"))}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _read_json(path: Path, notes: list[str], what: str) -> dict[str, Any]:
    if not path.is_file():
        notes.append(f"{path.name} is missing: {what}.")
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        notes.append(f"{path.name} cannot be read ({type(exc).__name__}): {what}.")
        return {}
    if not isinstance(obj, dict):
        notes.append(f"{path.name} does not hold a JSON object: {what}.")
        return {}
    return obj


def _metrics(obj: dict[str, Any]) -> dict[str, float]:
    return {str(k): v for k, v in ((k, _finite(v)) for k, v in obj.items()) if v is not None}


def _loss_rows(history: Any) -> list[LossRow]:
    rows = []
    if not isinstance(history, list):
        return rows
    for i, row in enumerate(history):
        if not isinstance(row, dict):
            continue
        values = {str(k): v for k, v in ((k, _finite(v)) for k, v in row.items() if k not in _NOT_PARTS)
                  if v is not None}
        if not values:
            continue
        step = _finite(row.get("step"))
        stage = row.get("stage")
        rows.append(LossRow(stage=str(stage) if stage is not None else "train",
                            step=int(step) if step is not None else i + 1, values=values,
                            lr=_finite(row.get("lr"))))
    return rows


def _routing_stats(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict):
        return {}
    names, load = obj.get("names"), obj.get("running_load")
    if not isinstance(names, list) or not isinstance(load, list) or not load or len(names) != len(load):
        return {}
    values = [_finite(v) for v in load]
    if any(v is None for v in values):
        return {}
    seen = _finite(obj.get("inputs_seen"))
    return {"names": [str(n) for n in names], "load": values, "inputs_seen": int(seen) if seen else 0}


def _load_rows(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("names"), list) \
            or not isinstance(obj.get("rows"), list):
        return {}
    names = [str(n) for n in obj["names"]]
    rows = []
    for row in obj["rows"]:
        if not isinstance(row, dict) or not isinstance(row.get("load"), list) \
                or len(row["load"]) != len(names):
            continue
        load = [_finite(v) for v in row["load"]]
        step = _finite(row.get("step"))
        if step is None or any(v is None for v in load):
            continue
        rows.append({"stage": str(row.get("stage", "")), "step": int(step), "load": load})
    return {"names": names, "rows": rows} if names and rows else {}


def read_run(path: str | Path) -> RunFolder:
    """Read a run folder (see the module docstring).

    Raises:
        MedAdaptError: ``path`` is not a folder, or holds no ``recipe.yaml`` / ``train_log.json`` (not a
            run of ``medadapt train``), or those two cannot be read.
    """
    path = Path(path)
    if not path.is_dir():
        raise MedAdaptError(f"{path} is not a folder; give a run folder written by `medadapt train`")
    missing = [n for n in ("recipe.yaml", "train_log.json") if not (path / n).is_file()]
    if missing:
        raise MedAdaptError(f"{path} is not a medadapt run folder (no {' or '.join(missing)}); give a folder "
                            "written by `medadapt train`")
    try:
        recipe = read_yaml(path / "recipe.yaml")[0]  # the YAML input policy: a ConfigError with file:line
    except OSError as exc:
        raise MedAdaptError(f"cannot read {path / 'recipe.yaml'}: {type(exc).__name__}") from None
    try:
        log = json.loads((path / "train_log.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MedAdaptError(f"cannot read {path / 'train_log.json'}: {type(exc).__name__}") from None
    if not isinstance(recipe, dict) or not isinstance(log, dict):
        raise MedAdaptError(f"{path} is not a medadapt run folder (recipe.yaml / train_log.json are not "
                            "mappings)")
    notes: list[str] = []
    metrics = _metrics(_read_json(path / "metrics.json", notes, "no metrics of the trained model"))
    baseline = _metrics(_read_json(path / "baseline_metrics.json", notes,
                                   "no frozen-baseline metrics (the recipe had eval.baseline off, or the "
                                   "evaluation was skipped)"))
    return RunFolder(path=path, name=str(recipe.get("name") or path.name),
                     description=str(recipe.get("description") or ""), kind=str(recipe.get("kind") or "?"),
                     recipe=recipe, log=log, loss_rows=_loss_rows(log.get("loss_history")), metrics=metrics,
                     baseline=baseline, notes=notes)
