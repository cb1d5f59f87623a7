"""Loading models: ``medadapt.load(path)`` is ``SentenceTransformer(path)`` plus alias resolution, clear
errors, the device check (:mod:`medadapt.devices`), the code policy (:mod:`medadapt.trust`: no code from a
model folder without ``trust_remote_code=True``), side modules and a width check of every ``AdapterStack``.
"""

from __future__ import annotations

import difflib
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import medadapt.adapters  # noqa: F401  (SentenceTransformer.add_adapter / load_adapter know medadapt heads)
from medadapt.adapters.api import _route_dim
from medadapt.adapters.files import is_adapter_folder, load_adapter_model
from medadapt.adapters.stack import AdapterStack
from medadapt.backends import apply_backend, check_backend, require_backend
from medadapt.devices import check_device
from medadapt.errors import ModelLoadError
from medadapt.identity import model_fingerprint
from medadapt.model_names import ALIAS_NAMES, ALIASES, module_classes, read_model_json
from medadapt.trust import (PICKLE_WEIGHTS, TRUSTED_MODULE_PREFIXES, folder_code_policy, medadapt_module_class,
                            pickled_weights, remote_code_needs, shipped_code)

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

__all__ = ["ALIASES", "ALIAS_NAMES", "PICKLE_WEIGHTS", "SIDE_MODULES", "TRUSTED_MODULE_PREFIXES", "check_device",
           "check_head_widths", "load", "medadapt_module_class", "model_fingerprint", "model_name_for",
           "module_classes", "pickled_weights", "remote_code_needs", "resolve_model_path", "set_identity",
           "shipped_code", "side_module_refs"]


def resolve_model_path(name_or_path: str) -> str:
    """A local directory for an alias or path, or the name unchanged for a hub id.

    A missing name is a hub id only if it could be one (``name`` or ``owner/name`` by Hugging Face's rules,
    ``owner`` not a folder here); a missing path-like name (``./x``, ``a/b/c``, ``my model``, ``runs/dem``
    beside ``runs/``) is one :class:`ModelLoadError` at once, naming the closest existing folders.
    """
    key = str(name_or_path).strip()
    if not key:
        raise ModelLoadError("the model name is empty (give an alias, a folder or a hub id)")
    if key.lower() in ALIASES:
        return str(ALIASES[key.lower()]())
    path = Path(key).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {key!r} is a file; expected a model directory")
        return str(path)
    why = _path_like(key)
    if why is not None:
        raise ModelLoadError(f"model path {key!r} does not exist{_closest(key, path)}{why}")
    return key


def _path_like(key: str) -> str | None:
    """Why ``key`` (not an existing path) is read as a local path, for the error (``""``: plainly a path);
    ``None`` for a name that may be a hub id."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if key.startswith((".", "/", "~")) or key.count("/") > 1 or "\\" in key:
        return ""
    owner = key.split("/", 1)[0]
    if "/" in key and Path(owner).is_dir():
        return f"; {owner + '/'!r} is a folder here, so this is read as a path in it, not as a hub id"
    try:
        validate_repo_id(key)
    except HFValidationError:
        return "; it is no valid Hugging Face hub id either"
    return None


def _closest(key: str, path: Path, limit: int = 10_000) -> str:
    """`` (did you mean 'runs/demo'?)``: the folders closest to the first missing part of ``path``, spelled
    as the user did; or the aliases when none is close."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    missing = path.relative_to(parent).parts[0] if parent != path else ""
    names: list[str] = []
    try:
        with os.scandir(parent) as entries:
            for i, entry in enumerate(entries):
                if i >= limit:
                    break
                if entry.is_dir() and not entry.name.startswith("."):
                    names.append(entry.name)
    except OSError:  # not a folder, not readable: no suggestion
        pass
    close = difflib.get_close_matches(missing, names, n=3, cutoff=0.6) if missing else []
    if not close:
        return f" (aliases: {', '.join(sorted(ALIASES))})"
    depth = len(path.relative_to(parent).parts)  # how many trailing parts of the key are missing
    kept = Path(key).parts[:-depth]  # the existing part as the user spelled it ("~" unexpanded)
    spelled = [str(Path(*kept, name)) for name in close]
    return f" (did you mean {' or '.join(repr(s) for s in spelled)}?)"


try:  # a truncated or damaged model.safetensors raises safetensors' own error type (not an OSError)
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # pragma: no cover - safetensors comes with transformers
    class _SafetensorError(Exception):
        pass


#: Modules a folder keeps beside its own files, appended on load: ``[{"path": ..., "type": ...}]``; a HyReC
#: folder saved before its branch was a module holds it in ``hyrec/``.
SIDE_MODULES = "side_modules.json"
_OLD_LAYOUT_SIDE_MODULES = [{"path": "hyrec", "type": "medadapt.hyrec.model.LexicalBranch"}]


def side_module_refs(folder: Path) -> list[dict]:
    """The side modules of ``folder`` (:data:`SIDE_MODULES`) not already in its ``modules.json``."""
    if (folder / SIDE_MODULES).is_file():
        entries = read_model_json(folder / SIDE_MODULES)
    elif (folder / "hyrec" / "config.json").is_file():
        entries = _OLD_LAYOUT_SIDE_MODULES
    else:
        return []
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ModelLoadError(f"{folder / SIDE_MODULES}: expected a list of {{path, type}} objects")
    named = set(module_classes(folder)) if (folder / "modules.json").is_file() else set()
    return [e for e in entries if e.get("type") not in named]


def add_side_modules(model, folder: Path) -> None:
    """Append ``folder``'s side modules to ``model``, each read by its class's ``load_side(path, model)``
    (medadapt classes only, from the installed package)."""
    for entry in side_module_refs(folder):
        ref, path = str(entry.get("type", "")), str(entry.get("path", ""))
        cls = medadapt_module_class(ref, str(folder))
        if not path or ".." in Path(path).parts or not callable(getattr(cls, "load_side", None)):
            raise ModelLoadError(f"{folder}: side module {ref!r} at {path!r} is not a medadapt side module")
        module = cls.load_side(folder / path, model)
        model.add_module(str(len(model._modules)), module.to(model.device))


def _width_before(modules: list) -> int | None:
    """The width of the embedding the modules produce, from what each reports (a ``Pooling`` recording
    another token width than its input's scales with the real one, as its output does)."""
    width = None
    for module in modules:
        token_dim = getattr(module, "embedding_dimension", None)
        pooled = getattr(module, "pooling_output_dimension", None)
        if (width is not None and isinstance(token_dim, int) and isinstance(pooled, int) and token_dim > 0
                and token_dim != width and pooled % token_dim == 0):
            width = pooled // token_dim * width  # a Pooling: one token-width block per pooling mode
            continue
        reported = _route_dim([module])
        if reported is not None:
            width = reported
    return width


def check_head_widths(model, name: str) -> None:
    """Every ``AdapterStack`` (top level or in a ``Router`` route) must be as wide as the embedding before
    it; else one :class:`ModelLoadError` naming both widths, not a reshape error at the first ``encode``."""
    def visit(modules: list, where: str) -> None:
        for i, module in enumerate(modules):
            if not isinstance(module, AdapterStack):
                continue
            width = _width_before(modules[:i])
            if width is not None and int(width) != int(module.dim):
                heads = ", ".join(module.names()) or "(no heads)"
                raise ModelLoadError(
                    f"model {name!r}: the adapter stack{where} (heads: {heads}) is {module.dim}-d but the embedding "
                    f"before it is {width}-d; the heads were trained on another backbone"
                )

    top = list(getattr(model, "_modules", {}).values())
    visit(top, "")
    for module in top:
        routes = getattr(module, "sub_modules", None)  # a Router: an nn.ModuleDict of routes
        if routes is not None and callable(getattr(routes, "items", None)):
            for route, seq in routes.items():
                visit(list(seq), f" of route {route!r}")


def load(name_or_path: str, device: str | None = None, *, trust_remote_code: bool | None = None,
         base: str | None = None, backend: str = "torch", **kwargs) -> SentenceTransformer:
    """Load a SentenceTransformer (with any medadapt heads) from an alias, a folder or a hub id.

    Args:
        name_or_path: an alias (``"minilm"``), a model folder, an adapter-only folder (its base is loaded,
            checked and the heads put on it) or a hub id.
        base: for an adapter-only folder, the base to load instead of the one it records (same weights).
        device: ``"cpu"``, ``"cuda:1"``, ... (default: sentence-transformers' choice); refused if missing.
        trust_remote_code: ``None`` (default) applies the code policy (:mod:`medadapt.trust`; hub ids never
            get the flag); ``False``: the same checks, the flag never set; ``True``: passed on as given.
        backend: ``"torch"`` (default), ``"onnx"``, ``"onnx-int8"`` or ``"openvino"``: the transformer then
            runs on that CPU runtime (:mod:`medadapt.backends`).
        **kwargs: passed to ``SentenceTransformer``.

    Every failure (name, folder, device, code policy, head width) is one :class:`ModelLoadError`.
    """
    check_device(device)
    if check_backend(backend) != "torch":
        require_backend(backend)  # before loading anything: a missing package is one clear error
        if device is not None and not str(device).strip().startswith("cpu"):
            raise ModelLoadError(f"backend {backend!r} runs on the CPU; use device 'cpu' or backend 'torch'")
    resolved = resolve_model_path(name_or_path)
    local = Path(resolved).is_dir()
    if local and is_adapter_folder(resolved):
        model = load_adapter_model(resolved, load, base=base, device=device,
                                   trust_remote_code=trust_remote_code, **kwargs)
        add_side_modules(model, Path(resolved))
        set_identity(model, name_or_path, resolved, replace=True)  # the base's identity was set on its load
        return apply_backend(model, backend)
    if base is not None:
        raise ModelLoadError(f"base= applies to adapter-only folders; {name_or_path!r} is not one")
    from sentence_transformers import SentenceTransformer

    classes: dict[str, type] = {}
    if local:
        classes, trust_remote_code = folder_code_policy(
            Path(resolved), str(name_or_path), trust_remote_code,
            with_classes=hasattr(SentenceTransformer, "_load_with_module_classes"))
    elif trust_remote_code is not True:
        trust_remote_code = False  # hub ids never get the flag from the policy

    try:
        if classes:
            model = SentenceTransformer._load_with_module_classes(
                resolved, classes, device=device, trust_remote_code=trust_remote_code, **kwargs)
        else:
            model = SentenceTransformer(resolved, device=device, trust_remote_code=trust_remote_code, **kwargs)
        model._medadapt_base_name = str(name_or_path)  # recorded (never as an absolute path) by save_adapter
    except ModelLoadError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, ImportError, AssertionError, _SafetensorError,
            pickle.UnpicklingError, AttributeError, TypeError) as exc:  # RecursionError is a RuntimeError;
        # AttributeError / TypeError: a trusted folder naming something that is no module (``os.system``)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ("; pass trust_remote_code=True if you trust this model's code"
                if "trust_remote_code" in str(exc) and not trust_remote_code else "")
        if not local:
            raise ModelLoadError(
                f"cannot load model {name_or_path!r}: not a local folder, not an alias "
                f"({', '.join(sorted(ALIASES))}), and the hub lookup failed ({first}){hint}"
            ) from exc
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {first}{hint}") from exc
    if local:
        add_side_modules(model, Path(resolved))
    check_head_widths(model, str(name_or_path))
    set_identity(model, name_or_path, resolved)
    return apply_backend(model, backend)


def model_name_for(name_or_path: str, resolved: str) -> str:
    """The ``org/name`` :func:`load` gives a model (MTEB's format): an alias's public name, the hub id,
    ``medadapt/<folder>`` for a folder medadapt saved, ``local/<folder>`` for another folder."""
    key = str(name_or_path).strip()
    if key.lower() in ALIAS_NAMES:
        return ALIAS_NAMES[key.lower()]
    path = Path(resolved)
    if not path.is_dir():
        return key if "/" in key else f"hub/{key}"
    try:
        ours = (is_adapter_folder(path) or (path / "recipe.yaml").is_file()
                or any(c.startswith("medadapt.") for c in module_classes(path)))
    except ModelLoadError:
        ours = False
    return f"{'medadapt' if ours else 'local'}/{path.resolve().name or 'model'}"


def set_identity(model, name_or_path: str, resolved: str, replace: bool = False) -> None:
    """Give a loaded model a name (:func:`model_name_for`) and a revision (the weights fingerprint, unless
    a hub revision is recorded) in its card, where MTEB's result cache reads them, and as
    ``model.medadapt_name`` / ``medadapt_revision``. ``replace``: overwrite both (an adapter folder)."""
    card = getattr(model, "model_card_data", None)
    revision = model_fingerprint(model)
    name = model_name_for(name_or_path, resolved)
    if card is not None:
        if replace or not getattr(card, "model_name", None):
            card.model_name = name
        if replace or not getattr(card, "base_model_revision", None):
            card.base_model_revision = revision
        name = card.model_name
    model.medadapt_name = name
    model.medadapt_revision = revision
