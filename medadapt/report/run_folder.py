"""Reading a run folder of ``medadapt train`` for the report, tolerantly: a missing or unreadable optional file
(``metrics.json``, ``baseline_metrics.json``) becomes a note; only a folder without ``recipe.yaml`` /
``train_log.json`` is refused."""

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
    """What the report reads from a run folder: the recipe (``name``, ``description``, ``kind``), the training
    log and its finite ``loss_history`` rows, the metrics and baseline metrics (empty when absent), and
    ``notes`` on what was missing or unreadable."""

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

    def _text(self, section: str, key: str) -> str | None:
        value = self.recipe.get(section)
        value = value.get(key) if isinstance(value, dict) else None
        return value if isinstance(value, str) and value else None

    def data_path(self) -> str | None:
        """The evaluation data the recipe names (``eval.data``, else ``data.path``), as written."""
        return self._text("eval", "data") or self._text("data", "path")

    def eval_split(self) -> str | None:
        return self._text("eval", "split")

    def expert_load(self) -> dict[str, Any]:
        """The logged MoE expert load: ``final`` (the last stage's, per routed expert) and ``per_step``, each
        ``{}`` when absent or malformed."""
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


def _numbers(values: Any, n: int) -> list[float] | None:
    """``values`` when it is a list of ``n`` finite numbers, else ``None``."""
    finite = [_finite(v) for v in values] if isinstance(values, list) and len(values) == n else [None]
    return None if any(v is None for v in finite) else finite


def _routing_stats(obj: Any) -> dict[str, Any]:
    names = obj.get("names") if isinstance(obj, dict) else None
    load = _numbers(obj.get("running_load"), len(names)) if isinstance(names, list) and names else None
    if load is None:
        return {}
    seen = _finite(obj.get("inputs_seen"))
    return {"names": [str(n) for n in names], "load": load, "inputs_seen": int(seen) if seen else 0}


def _load_rows(obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("names"), list) or not isinstance(obj.get("rows"), list):
        return {}
    names = [str(n) for n in obj["names"]]
    rows = []
    for row in obj["rows"]:
        load = _numbers(row.get("load"), len(names)) if isinstance(row, dict) else None
        step = _finite(row.get("step")) if load is not None else None
        if step is not None:
            rows.append({"stage": str(row.get("stage", "")), "step": int(step), "load": load})
    return {"names": names, "rows": rows} if names and rows else {}


def read_run(path: str | Path) -> RunFolder:
    """Read a run folder; one without a readable ``recipe.yaml`` / ``train_log.json`` is a MedAdaptError."""
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
