"""Datasets that ship inside the package (written by the medadapt team, CC0), usable with no data of
the user's: pass their name wherever a data folder is expected."""

from __future__ import annotations

from pathlib import Path

BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"

#: name -> folder in BEIR layout (plus ``sts.jsonl``)
BUILTIN_DATASETS: dict[str, Path] = {"medmini": BUILTIN_ROOT / "medmini"}


def resolve_data_dir(name_or_path: str | Path) -> Path:
    """Map a builtin dataset name to its folder; return other values as a ``Path`` unchanged."""
    key = str(name_or_path)
    if key in BUILTIN_DATASETS:
        return BUILTIN_DATASETS[key]
    return Path(key).expanduser()
