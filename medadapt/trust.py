"""The code policy of :func:`medadapt.load`: what a local model folder may name or hold and still load
without the caller's ``trust_remote_code=True`` (docs/guarantees.md, "Untrusted input").

Module classes named ``sentence_transformers.*`` / ``medadapt.*`` are imported from the installed packages,
never from the folder; foreign classes, an ``auto_map`` in any JSON file and pickle-only weights are refused.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import json
import warnings
from pathlib import Path

from medadapt.errors import ModelLoadError
from medadapt.model_names import module_classes, read_model_json

__all__ = ["PICKLE_WEIGHTS", "TRUSTED_MODULE_PREFIXES", "folder_code_policy", "medadapt_module_class",
           "not_a_module_class", "pickled_weights", "remote_code_needs", "shipped_code"]

#: Module-class prefixes a local folder may name without ``trust_remote_code=True``.
TRUSTED_MODULE_PREFIXES = ("sentence_transformers.", "medadapt.")

#: Weight files read with ``torch.load`` (pickle), each with the safetensors files read instead when present.
PICKLE_WEIGHTS = {"pytorch_model.bin": ("model.safetensors", "model.safetensors.index.json"),
                  "pytorch_model-*.bin": ("model.safetensors", "model.safetensors.index.json"),
                  "adapter_model.bin": ("adapter_model.safetensors",)}


def _has_auto_map(data) -> bool:
    """``auto_map`` at the top level of a Hugging Face config, or in one of its nested ``*_config`` dicts."""
    if not isinstance(data, dict):
        return False
    if data.get("auto_map"):
        return True
    return any(isinstance(v, dict) and v.get("auto_map") for k, v in data.items() if str(k).endswith("_config"))


def shipped_code(folder: str | Path) -> str | None:
    """The first ``*.json`` of ``folder`` (any depth) whose ``auto_map`` makes Hugging Face import code from
    the folder, described for an error; or ``None``."""
    folder = Path(folder)
    for path in sorted(folder.rglob("*.json")):
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ModelLoadError(f"{path}: cannot read ({exc.strerror or exc})") from None
        if b'"auto_map"' not in raw:
            continue
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # unreadable here: refuse, Hugging Face may read it otherwise
            return f"custom model code (an 'auto_map' in {path.relative_to(folder).as_posix()})"
        if _has_auto_map(data):
            return f"custom model code (auto_map in {path.relative_to(folder).as_posix()})"
    return None


def remote_code_needs(folder: str | Path) -> tuple[bool, str | None]:
    """``(names_medadapt_classes, foreign)`` for a local folder: whether it names a medadapt module class,
    and the first thing that would run code medadapt does not vouch for (a class outside
    :data:`TRUSTED_MODULE_PREFIXES`, or an ``auto_map``), or ``None``."""
    folder = Path(folder)
    classes = module_classes(folder)
    foreign = next((c for c in classes if not c.startswith(TRUSTED_MODULE_PREFIXES)), None)
    if foreign is not None:
        return True, f"module class {foreign or '(none)'!r}"
    code = shipped_code(folder)
    if code is not None:
        return True, code
    return any(c.startswith("medadapt.") for c in classes), None


def medadapt_module_class(ref: str, name: str) -> type:
    """The ``torch.nn.Module`` class ``ref`` names in the installed medadapt package (never from a folder);
    anything else is a :class:`ModelLoadError` naming ``name``."""
    from torch import nn

    module_path, _, attr = ref.rpartition(".")
    obj = None
    if ref.startswith("medadapt.") and not any(part.startswith("__") for part in ref.split(".")):
        try:  # (a dunder part: e.g. medadapt.__main__ runs the CLI)
            obj = getattr(importlib.import_module(module_path), attr, None)
        except ImportError:
            pass
    if not (inspect.isclass(obj) and issubclass(obj, nn.Module)
            and str(getattr(obj, "__module__", "")).startswith("medadapt")):
        raise ModelLoadError(f"model folder {name!r} names module class {ref!r}, which is not a module "
                             "class of the installed medadapt")
    return obj


def medadapt_classes(folder: Path, name: str) -> dict[str, type]:
    """Every ``medadapt.*`` module class ``folder`` names, from the installed package, by its name in
    ``modules.json``."""
    return {ref: medadapt_module_class(ref, name) for ref in module_classes(folder) if ref.startswith("medadapt.")}


def not_a_module_class(folder: Path) -> str | None:
    """The first ``sentence_transformers.*`` name of ``folder`` that is not a module class of the installed
    sentence-transformers (a function such as ``util.http_get``, a model class, a package), described for an
    error; or ``None``. Sentence-transformers would call it with the folder."""
    from sentence_transformers.util import import_from_string

    try:
        from sentence_transformers.base.modules import Module
    except ImportError:  # pragma: no cover - older layouts: any torch module class
        from torch.nn import Module
    for ref in module_classes(folder):
        if not ref.startswith("sentence_transformers."):
            continue
        obj = None
        if not any(part.startswith("__") or not part for part in ref.split(".")):  # __main__ would run
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # deprecated paths (sentence_transformers.models.*)
                    obj = import_from_string(ref)
            except ImportError:
                pass
        if not (inspect.isclass(obj) and issubclass(obj, Module)):
            return f"{ref!r}, which is not a module class of the installed sentence-transformers"
    return None


def pickled_weights(folder: str | Path) -> str | None:
    """The first pickle weight file of ``folder`` (any depth, :data:`PICKLE_WEIGHTS`) that loading would
    unpickle (no safetensors file beside it), relative to ``folder``; or ``None``."""
    folder = Path(folder)
    for path in sorted(folder.rglob("*.bin")):
        for pattern, safe in PICKLE_WEIGHTS.items():
            if fnmatch.fnmatchcase(path.name, pattern) and not any((path.parent / s).is_file() for s in safe):
                return path.relative_to(folder).as_posix()
    return None


def implicit_trust_hazard(folder: Path) -> str | None:
    """What ``trust_remote_code=True`` would also let a folder run besides its medadapt classes (for
    sentence-transformers without ``_load_with_module_classes``): a class Hugging Face reads as
    ``file.Class`` from the folder, or a ``Dense`` activation that is not a ``torch.*`` class."""
    for ref in module_classes(folder):
        if "--" in ref or ref.count(".") < 2 or any(part.startswith("__") for part in ref.split(".")):
            return f"module class {ref!r}"
    for path in sorted(folder.rglob("config.json")):
        data = read_model_json(path)
        act = data.get("activation_function") if isinstance(data, dict) else None
        if act is not None and not (isinstance(act, str) and act.startswith("torch.")):
            return f"activation function {act!r} (in {path.relative_to(folder).as_posix()})"
    return None


def folder_code_policy(folder: Path, name: str, trust_remote_code: bool | None,
                       with_classes: bool) -> tuple[dict[str, type], bool]:
    """Apply the policy to a local folder before loading: ``(medadapt classes to load it with, the
    trust_remote_code to pass)``. ``with_classes``: sentence-transformers can be handed module classes
    (``_load_with_module_classes``); without it only the flag makes it import medadapt's.

    Raises:
        ModelLoadError: a name that is not an installed module class (checked even when trusted), and
            unless ``trust_remote_code`` is true: foreign code, ``auto_map`` or pickle-only weights.
    """
    odd = not_a_module_class(folder)
    if odd is not None:
        raise ModelLoadError(f"model folder {name!r} names {odd}; nothing was loaded")
    if trust_remote_code is True:
        return {}, True
    needed, foreign = remote_code_needs(folder)
    if foreign is not None:
        raise ModelLoadError(
            f"model folder {name!r} names {foreign}, code outside sentence_transformers and medadapt; medadapt "
            "does not run code from model folders: pass trust_remote_code=True if you trust it"
        )
    pickled = pickled_weights(folder)
    if pickled is not None:
        raise ModelLoadError(
            f"model folder {name!r} holds its weights as a pickle file ({pickled}) with no safetensors file "
            "beside it; unpickling can run code, so medadapt does not load it: save the model as safetensors "
            "where you trust it, or pass trust_remote_code=True if you trust it"
        )
    if needed and with_classes:
        return medadapt_classes(folder, name), False
    if needed and trust_remote_code is None:
        hazard = implicit_trust_hazard(folder)
        if hazard is not None:
            raise ModelLoadError(f"model folder {name!r} names {hazard}; medadapt does not run code from model "
                                 "folders: pass trust_remote_code=True if you trust it")
        return {}, True
    return {}, False
