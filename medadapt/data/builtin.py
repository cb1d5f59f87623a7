"""Datasets that ship inside the package (pass the name wherever a data folder is expected): ``medmini``
(200 CC0 passages, a smoke test), ``medquad-mini`` (1,446 NIH answers and 1,450 questions of MedQuAD, CC BY
4.0, in whole topic clusters; ``benchmarks/make_medquad_mini.py``) and ``tiny-beir`` (built on first use).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from medadapt.errors import DataError
from medadapt.tiny import tiny_path

BUILTIN_ROOT = Path(__file__).resolve().parent / "builtin"

#: name -> folder in BEIR layout (medmini also has ``sts.jsonl``)
BUILTIN_DATASETS: dict[str, Path] = {
    "medmini": BUILTIN_ROOT / "medmini",
    "medquad-mini": BUILTIN_ROOT / "medquad-mini",
}

#: name -> the folder of a dataset built on first use (BEIR layout)
BUILT_DATASETS: dict[str, Callable[[], Path]] = {
    "tiny-beir": lambda: tiny_path("tiny-beir"),
}


def is_builtin_dataset(name: str | Path) -> bool:
    """Whether ``name`` is the name of a builtin dataset (shipped or built on first use)."""
    return str(name) in BUILTIN_DATASETS or str(name) in BUILT_DATASETS


def resolve_data_dir(name_or_path: str | Path) -> Path:
    """Map a builtin dataset name to its folder (building it on first use); return other values as a
    ``Path`` unchanged."""
    key = str(name_or_path)
    if key in BUILTIN_DATASETS:
        return BUILTIN_DATASETS[key]
    if key in BUILT_DATASETS:
        return BUILT_DATASETS[key]()
    return Path(key).expanduser()


def builtin_names() -> list[str]:
    """The names of every builtin dataset, in the order they are documented."""
    return [*BUILTIN_DATASETS, *BUILT_DATASETS]


def data_folder(name_or_path: str | Path, what: str = "data folder") -> Path:
    """:func:`resolve_data_dir`, then refuse a value that names no folder: the error lists the builtin
    dataset names (a mistyped name is the usual cause)."""
    root = resolve_data_dir(name_or_path)
    if not root.is_dir():
        raise DataError(f"{what} not found: {name_or_path} is neither a folder nor a builtin dataset "
                        f"({', '.join(builtin_names())})")
    return root
