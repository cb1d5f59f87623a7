"""Resolve model names (aliases, local folders, hub ids) and load them as ``SentenceTransformer``.

``medadapt.load(path)`` is ``SentenceTransformer(path)`` plus alias resolution, clear errors, a device check,
a width check of every ``AdapterStack`` and a code policy: medadapt never runs code shipped in a model folder
unless the caller passes ``trust_remote_code=True``. Folders naming only ``sentence_transformers.*`` /
``medadapt.*`` module classes load with those classes imported from the installed packages; foreign classes,
``auto_map`` in any JSON file and pickle-only weights are refused, and path-like names are never looked up on
the hub. The full policy: docs/guarantees.md, "Untrusted input".
"""

from __future__ import annotations

import difflib
import json
import os
import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import medadapt.adapters  # noqa: F401  (SentenceTransformer.add_adapter / load_adapter know medadapt heads)
from medadapt.adapters.api import _route_dim
from medadapt.adapters.files import is_adapter_folder, load_adapter_model
from medadapt.adapters.stack import AdapterStack
from medadapt.backends import apply_backend, check_backend, require_backend
from medadapt.errors import ModelLoadError
from medadapt.model_names import ALIAS_NAMES, ALIASES, module_classes, read_model_json as _read_json  # noqa: F401 - re-exported
from medadapt.identity import model_fingerprint, modules_fingerprint, tokenizer_fingerprint  # noqa: F401 - re-exported

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer


def resolve_model_path(name_or_path: str) -> str:
    """Return a local directory for an alias or path, or the name unchanged for a hub id.

    A name that does not exist locally is a hub id only if it could be one: ``name`` or ``owner/name``
    (Hugging Face's rules: letters, digits, ``-``, ``_``, ``.``) whose ``owner`` is not a folder here. So
    ``./x``, ``../x``, ``/abs``, ``~/x``, ``a/b/c``, ``a\\b``, ``my model`` and ``runs/dem`` when ``runs/``
    exists are local paths, and a missing one is one :class:`ModelLoadError` at once, naming the closest
    existing folders (no hub lookup with its retries). The price: with a folder ``owner/`` in the working
    directory, the hub id ``owner/name`` is read as that folder's ``name`` (run from another folder).

    Raises:
        ModelLoadError: a path-like name that does not exist, or a file.
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
    """Why ``key`` (not an existing path) is read as a local path, for the error message (``""`` when
    plain: it starts like a path, has a separator too many, or cannot be a hub id); ``None`` for a
    name that may be a hub id."""
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
    """`` (did you mean 'runs/demo'?)``: the existing folders closest to the first missing part of ``path``
    (difflib over the folders beside it), spelled as the user did; or the aliases when none is close."""
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


#: Module-class prefixes a local folder may name and still be loaded without the caller's explicit
#: ``trust_remote_code=True``.
TRUSTED_MODULE_PREFIXES = ("sentence_transformers.", "medadapt.")


def _has_auto_map(data) -> bool:
    """``auto_map`` at the top level of a Hugging Face config, or in one of its nested ``*_config`` dicts."""
    if not isinstance(data, dict):
        return False
    if data.get("auto_map"):
        return True
    return any(isinstance(v, dict) and v.get("auto_map") for k, v in data.items() if str(k).endswith("_config"))


def shipped_code(folder: str | Path) -> str | None:
    """The first ``*.json`` file of ``folder`` (any depth) with an ``auto_map``, i.e. one that makes Hugging
    Face import Python code from the folder (``config.json``, ``tokenizer_config.json``,
    ``processor_config.json``, ``preprocessor_config.json`` ...), described for an error message; or ``None``."""
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
    """``(names_medadapt_classes, foreign)`` for a local model folder: whether it names a medadapt module
    class (sentence-transformers imports only its own classes without help), and the first thing that makes
    loading it run code medadapt does not vouch for (a module class outside
    :data:`TRUSTED_MODULE_PREFIXES`, or an ``auto_map`` in any ``*.json``, i.e. Python code shipped with the
    model), or ``None``."""
    folder = Path(folder)
    classes = module_classes(folder)
    foreign = next((c for c in classes if not c.startswith(TRUSTED_MODULE_PREFIXES)), None)
    if foreign is not None:
        return True, f"module class {foreign or '(none)'!r}"
    code = shipped_code(folder)
    if code is not None:
        return True, code
    return any(c.startswith("medadapt.") for c in classes), None


def _medadapt_classes(folder: Path, name: str) -> dict[str, type]:
    """Every ``medadapt.*`` module class ``folder`` names, imported from the installed medadapt package
    (never from the folder), mapped from the name ``modules.json`` uses. Each must be a ``torch.nn.Module``
    class defined in medadapt."""
    found: dict[str, type] = {}
    for ref in module_classes(folder):
        if not ref.startswith("medadapt.") or ref in found:
            continue
        found[ref] = medadapt_module_class(ref, name)
    return found


def medadapt_module_class(ref: str, name: str) -> type:
    """The ``torch.nn.Module`` class ``ref`` names in the installed medadapt package (never from a folder);
    anything else is a :class:`ModelLoadError` naming ``name``."""
    import importlib
    import inspect

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


def _not_a_module_class(folder: Path) -> str | None:
    """The first ``sentence_transformers.*`` name of ``folder`` that is not a sentence-transformers module
    class (a function such as ``sentence_transformers.util.http_get``, a whole model class, a package),
    described for an error; or ``None``. Sentence-transformers would call such a name's ``load`` or call
    it with the folder; it is resolved here in the installed package only (nothing from the folder)."""
    import inspect
    import warnings

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


#: Weight files that transformers, sentence-transformers or PEFT read with ``torch.load`` (pickle), each with
#: the safetensors files they read instead when one sits beside it.
PICKLE_WEIGHTS = {"pytorch_model.bin": ("model.safetensors", "model.safetensors.index.json"),
                  "pytorch_model-*.bin": ("model.safetensors", "model.safetensors.index.json"),
                  "adapter_model.bin": ("adapter_model.safetensors",)}


def pickled_weights(folder: str | Path) -> str | None:
    """The first pickle weight file of ``folder`` (any depth, :data:`PICKLE_WEIGHTS`) with no safetensors
    file beside it that loading would read instead, i.e. weights that loading would unpickle, relative to
    ``folder``; or ``None``."""
    import fnmatch

    folder = Path(folder)
    for path in sorted(folder.rglob("*.bin")):
        for pattern, safe in PICKLE_WEIGHTS.items():
            if fnmatch.fnmatchcase(path.name, pattern) and not any((path.parent / s).is_file() for s in safe):
                return path.relative_to(folder).as_posix()
    return None


def _implicit_trust_hazard(folder: Path) -> str | None:
    """What ``trust_remote_code=True`` would also let a folder run besides its medadapt classes (fallback
    for sentence-transformers without ``_load_with_module_classes``): a class reference Hugging Face reads
    as ``file.Class`` from the folder, or a ``Dense`` activation that is not a ``torch.*`` class."""
    for ref in module_classes(folder):
        if "--" in ref or ref.count(".") < 2 or any(part.startswith("__") for part in ref.split(".")):
            return f"module class {ref!r}"
    for path in sorted(folder.rglob("config.json")):
        data = _read_json(path)
        act = data.get("activation_function") if isinstance(data, dict) else None
        if act is not None and not (isinstance(act, str) and act.startswith("torch.")):
            return f"activation function {act!r} (in {path.relative_to(folder).as_posix()})"
    return None


try:  # a truncated or damaged model.safetensors raises safetensors' own error type (not an OSError)
    from safetensors import SafetensorError as _SafetensorError
except ImportError:  # pragma: no cover - safetensors comes with transformers
    class _SafetensorError(Exception):
        pass


#: Modules a folder keeps beside its own files, appended on load: ``[{"path": ..., "type": ...}]`` (an
#: adapter-only folder's learned-lexical branch). A HyReC folder saved before its branch was a module names
#: none and holds it in ``hyrec/``.
SIDE_MODULES = "side_modules.json"
_OLD_LAYOUT_SIDE_MODULES = [{"path": "hyrec", "type": "medadapt.hyrec.model.LexicalBranch"}]


def side_module_refs(folder: Path) -> list[dict]:
    """The side modules of ``folder`` (:data:`SIDE_MODULES`) not already in its ``modules.json``."""
    if (folder / SIDE_MODULES).is_file():
        entries = _read_json(folder / SIDE_MODULES)
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


def check_device(device) -> None:
    """Refuse a device this machine does not have, with one clear :class:`ModelLoadError` (not torch's
    ``AssertionError: Torch not compiled with CUDA enabled`` at the first tensor move). ``None``: auto."""
    if device is None:
        return
    import torch

    text = str(device).strip()
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise ModelLoadError(f"unknown device {text!r} (expected cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {text!r}: CUDA is not available on this machine (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(f"device {text!r}: MPS (Apple GPU) is not available on this machine "
                                 "(use --device cpu)")
        return
    backend = getattr(torch, dev.type, None) if dev.type in ("xpu", "npu", "hpu") else None
    available = getattr(backend, "is_available", None)
    if callable(available):
        if not available():
            raise ModelLoadError(f"device {text!r}: {dev.type.upper()} is not available on this machine")
        return
    raise ModelLoadError(f"unsupported device {text!r} (expected cpu, cuda, cuda:N or mps)")


def _width_before(modules: list) -> int | None:
    """The width of the embedding the modules produce, from what each reports; a ``Pooling`` whose config
    records another token width than the module before it gives (a backbone swapped under it) scales with
    the real token width, as its output does."""
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
    """Every medadapt ``AdapterStack`` of ``model`` must be as wide as the embedding of the modules before
    it (top level or inside a ``Router`` route); else :class:`ModelLoadError` naming the head and both widths
    (instead of a reshape error at the first ``encode``)."""
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
         base: str | None = None, backend: str = "torch", **kwargs) -> "SentenceTransformer":
    """Load a SentenceTransformer (with any medadapt heads) from an alias, a folder or a hub id.

    Args:
        name_or_path: ``"minilm"`` (packaged all-MiniLM-L6-v2), a saved model folder, an adapter-only
            folder (:mod:`medadapt.adapters.files`: its base model is loaded, checked and the heads put on
            it), or a hub id such as ``"BAAI/bge-small-en-v1.5"`` (needs network access the first time).
        base: for an adapter-only folder, the base model to load instead of the one it records (it must
            have the same weights).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` (default: sentence-transformers' choice);
            a device this machine lacks is refused (:func:`check_device`).
        trust_remote_code: ``None`` (default) applies the code policy (module docstring): medadapt
            classes come from the installed package, code shipped in a folder is refused, hub ids never get
            the flag. ``False``: the same checks, and the flag is never set. ``True``: passed on as given (you
            trust the model's code, ``auto_map`` and foreign module classes included).
        backend: ``"torch"`` (default), ``"onnx"``, ``"onnx-int8"`` or ``"openvino"``: the model is loaded
            with torch, then its transformer runs on that CPU runtime (:mod:`medadapt.backends`; exported
            once per weights, heads unchanged, keyed separately in the embedding cache).
        **kwargs: passed to ``SentenceTransformer``.

    Raises:
        ModelLoadError: unknown name, unreadable folder, unavailable device, a folder naming foreign code
            or shipping code without ``trust_remote_code=True``, or a head whose width differs from the
            embedding it reads.
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
    odd = _not_a_module_class(Path(resolved)) if local else None  # installed classes: checked even if trusted
    if odd is not None:
        raise ModelLoadError(f"model folder {name_or_path!r} names {odd}; nothing was loaded")
    if trust_remote_code is not True:  # None (the policy) or an explicit False: no code from the folder
        implicit = trust_remote_code is None
        trust_remote_code = False
        if local:
            needed, foreign = remote_code_needs(resolved)
            if foreign is not None:
                raise ModelLoadError(
                    f"model folder {name_or_path!r} names {foreign}, code outside sentence_transformers and "
                    "medadapt; medadapt does not run code from model folders: pass trust_remote_code=True "
                    "if you trust it"
                )
            pickled = pickled_weights(resolved)
            if pickled is not None:
                raise ModelLoadError(
                    f"model folder {name_or_path!r} holds its weights as a pickle file ({pickled}) with no "
                    "safetensors file beside it; unpickling can run code, so medadapt does not load it: "
                    "save the model as safetensors where you trust it, or pass trust_remote_code=True if you "
                    "trust it"
                )
            if needed and hasattr(SentenceTransformer, "_load_with_module_classes"):
                classes = _medadapt_classes(Path(resolved), str(name_or_path))  # flag stays False
            elif needed and implicit:  # older sentence-transformers: only the flag makes it import medadapt
                hazard = _implicit_trust_hazard(Path(resolved))
                if hazard is not None:
                    raise ModelLoadError(
                        f"model folder {name_or_path!r} names {hazard}; medadapt does not run code from model "
                        "folders: pass trust_remote_code=True if you trust it"
                    )
                trust_remote_code = True

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
    """The name :func:`load` gives a model (``model_card_data.model_name``): an alias's public name
    (:data:`ALIAS_NAMES`), ``medadapt/<folder name>`` for a folder medadapt saved (an adapter folder, a run
    folder with ``recipe.yaml``, or one naming medadapt module classes), ``local/<folder name>`` for another
    local folder, the hub id itself for a hub model. Always ``org/name`` (MTEB's model-name format)."""
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
    """Give a loaded model a name and a revision, so that clients that file results by model (MTEB's result
    cache) keep two models apart: ``model_card_data.model_name`` (:func:`model_name_for`, unless the model
    already has one) and, unless sentence-transformers recorded a hub revision, the weights fingerprint
    (:func:`model_fingerprint`) as ``model_card_data.base_model_revision``, the field MTEB reads as the
    model's revision. Both are also kept as ``model.medadapt_name`` / ``model.medadapt_revision``. The
    revision is that of the weights as loaded; :func:`medadapt.eval.mteb.model_identity` recomputes it.
    ``replace``: overwrite both (an adapter folder loaded onto its base model, which got the base's)."""
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
