"""Adapter-only folders: the heads without the backbone, tied to the backbone they were trained on.

A folder holds ``medadapt_adapter.json`` (format, base model by name or relative path with its weight
fingerprint, heads with type, config and location, active heads), ``adapter_model.safetensors``
(``"<adapter name>.<parameter>"``), ``SHA256SUMS`` over those two, the model card ``README.md`` and a PEFT stub
``adapter_config.json``. :func:`load_adapter` checks the sums, then the receiving model's base fingerprint, before
building any head: a damaged file or another backbone is one clear :class:`~medadapt.errors.ModelLoadError` and
the model is left untouched. The fingerprint hashes the backbone's tokenizers and its weights rounded to bfloat16
(strided samples above 300M parameters): the same backbone in any dtype or device matches, any trained or
swapped weight does not. No absolute path is written. Nothing in the folder is code.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from medadapt._version import __version__
from medadapt.adapters.api import (_location_dim, _peft_names, adapter_locations, adapter_names, set_active,
                                   shared_backbone, stack_for)
from medadapt.adapters.stack import AdapterStack
from medadapt.adapters.types import adapter_type
from medadapt.cards import write_card
from medadapt.checksums import SUMS, ChecksumError, verify_sums, write_sums
from medadapt.errors import ConfigError, MedAdaptError, ModelLoadError, warn
from medadapt.finite import check_finite_tensors
from medadapt.identity import sha256_file, tokenizer_fingerprint
from medadapt.io import FolderKind, atomic_save_tensors, atomic_write_json, replace_folder
from medadapt.locks import model_lock
from medadapt.model_names import ALIAS_NAMES, ALIASES, module_classes

__all__ = ["ADAPTER_CONFIG", "ADAPTER_FOLDER", "ADAPTER_WEIGHTS", "PEFT_STUB", "base_fingerprint", "base_name",
           "is_adapter_folder", "load_adapter", "load_adapter_model", "read_adapter_config", "save_adapter",
           "write_adapter"]

ADAPTER_CONFIG = "medadapt_adapter.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_FORMAT = 2
#: 1: before ``SHA256SUMS`` (loads with a warning; its base fingerprint hashes the weights only).
READABLE_FORMATS = (1, 2)
#: The files ``SHA256SUMS`` must cover (anything a composed model adds, e.g. ``hyrec/``, has its own sums).
COVERED = (ADAPTER_CONFIG, ADAPTER_WEIGHTS)
#: An adapter folder: an existing non-empty folder is replaced only when it is one (:func:`save_adapter`).
ADAPTER_FOLDER = FolderKind("a medadapt adapter folder", (ADAPTER_CONFIG,))
#: PEFT's config file: without medadapt, PEFT reads it first and the stub's unknown ``peft_type`` stops it at once
#: with :data:`PEFT_STUB_MESSAGE`. It names no base (transformers would download it before failing) and is not in
#: ``SHA256SUMS`` (medadapt never reads it).
PEFT_STUB = "adapter_config.json"
PEFT_STUB_MESSAGE = ("this folder holds a medadapt adapter, not a PEFT one (medadapt_adapter.json): load it "
                     "with medadapt.load(folder), or run `import medadapt.adapters` before "
                     "SentenceTransformer.load_adapter(folder)")


def is_adapter_folder(path: Any) -> bool:
    """True for a local folder holding a medadapt adapter (``medadapt_adapter.json``)."""
    try:
        return (Path(os.fspath(path)) / ADAPTER_CONFIG).is_file()
    except TypeError:
        return False


def _base_tensors(model) -> dict[str, Any]:
    """The model's weights outside any adapter stack; a one-tower model split into routes
    (:func:`~medadapt.adapters.api.split_routes`) is named as the one-tower model, so its heads load onto the
    plain base."""
    skip = {id(p) for _, stack in adapter_locations(model) for p in [*stack.parameters(), *stack.buffers()]}
    one_tower = shared_backbone(model)
    if one_tower is not None:
        named = [(f"{i}.{name}", t) for i, module in enumerate(one_tower)
                 for name, t in [*module.named_parameters(), *module.named_buffers()]]
    else:
        named = [*model.named_parameters(), *model.named_buffers()]
    return {name: t for name, t in named if id(t) not in skip}


def base_fingerprint(model, full_hash_max_params: int = 300_000_000, version: int = ADAPTER_FORMAT) -> str:
    """Hash of ``model``'s backbone tokenizers and weights (heads excluded), dtype- and device-independent
    (module docstring). ``version=1``: the fingerprint adapters of format 1 recorded (weights only)."""
    tensors = _base_tensors(model)
    n_params = sum(t.numel() for t in tensors.values())
    h = hashlib.sha256(b"medadapt-base-1" if version == 1 else b"medadapt-base-2")
    seen: set[int] = set()
    for module in model.modules() if version != 1 else ():  # same weights, other tokens: other embeddings
        tokenizer = getattr(module, "tokenizer", None)
        if tokenizer is not None and id(tokenizer) not in seen:
            seen.add(id(tokenizer))
            h.update(f"tokenizer:{tokenizer_fingerprint(tokenizer)}".encode())
    for name in sorted(tensors):
        t = tensors[name].detach()
        h.update(f"{name}:{tuple(t.shape)}".encode())
        flat = t.reshape(-1)
        if n_params > full_hash_max_params and flat.numel() > 4096:
            flat = flat[:: max(1, flat.numel() // 4096)]
        if flat.is_floating_point():
            flat = flat.to(torch.bfloat16).to(torch.float32)
        h.update(flat.to("cpu").contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def base_name(model) -> str | None:
    """The name or folder of ``model``'s base: the name ``medadapt.load`` was given, else sentence-transformers'
    ``model_card_data.base_model``, else the folder (or cached hub model) it was loaded from; ``None`` when none
    is known (built in memory, or its folder is gone)."""
    name = getattr(model, "_medadapt_base_name", None)
    if name:
        return str(name)
    card = getattr(model, "model_card_data", None)
    return getattr(card, "base_model", None) or _loaded_from(model)


def _loaded_from(model) -> str | None:
    """Where a plain ``SentenceTransformer(path)`` came from: its transformer's ``config._name_or_path``, kept only
    when that folder (or cached hub model) builds the whole model, heads aside (an asymmetric model built in
    memory is not its first tower's folder)."""
    modules = shared_backbone(model) or list(getattr(model, "_modules", {}).values())
    if not modules or type(modules[0]).__name__ != "Transformer":
        return None
    transformer = getattr(modules[0], "auto_model", None) or getattr(modules[0], "model", None)
    source = str(getattr(getattr(transformer, "config", None), "_name_or_path", "") or "")
    if not source:
        return None
    types = [type(m).__name__ for m in modules if not isinstance(m, AdapterStack)]
    path = Path(source).expanduser()
    if path.is_dir():
        return source if _builds(path, types) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "config.json")
    except Exception:  # noqa: BLE001 - not a valid hub id, no cache: not identified
        return None
    return source if isinstance(cached, str) and _builds(Path(cached).parent, types) else None


def _builds(folder: Path, types: list[str]) -> bool:
    """Whether loading ``folder`` builds modules of classes ``types`` (heads aside): its ``modules.json``, or
    sentence-transformers' default for a plain transformers folder (``Transformer``, ``Pooling``)."""
    if not (folder / "modules.json").is_file():
        return types == ["Transformer", "Pooling"]
    try:
        listed = [c.rsplit(".", 1)[-1] for c in module_classes(folder)]
    except MedAdaptError:
        return False
    return [c for c in listed if c != "AdapterStack"] == types


def _alias_of(path: Path) -> str | None:
    """The alias whose packaged folder ``path`` is (``minilm``): recorded by that name, which loads offline
    wherever medadapt is installed (only packaged aliases are resolved: nothing is built)."""
    for alias in ALIAS_NAMES:
        try:
            if os.path.samefile(ALIASES[alias](), path):
                return alias
        except (MedAdaptError, OSError, KeyError):
            continue
    return None


def _aliases_named(name: str) -> list[str]:
    """The aliases whose public name (hub id) is ``name``: a folder recording that hub id tries them first
    (offline, packaged; kept only when the fingerprint matches)."""
    return [alias for alias, public in ALIAS_NAMES.items() if public == name and alias in ALIASES][:1]


def _base_record(model, folder: Path, name: str | None, final: str | None = None) -> dict[str, Any]:
    """The ``base_model`` entry; ``folder`` is where the adapter is written, ``final`` its final name in the
    same parent (relative paths are computed from there)."""
    name = name if name is not None else base_name(model)
    record: dict[str, Any] = {"name": None, "relative_path": None}
    if name:
        path = Path(name).expanduser()
        if not path.exists():
            record["name"] = str(name)  # an alias (minilm) or a hub id
        elif (alias := _alias_of(path)) is not None:
            record["name"] = alias  # a packaged alias's folder: its name, not a path into site-packages
        else:  # a local folder: recorded relative to the adapter folder, never absolute
            home = folder.resolve().parent / (final or folder.name)
            record["relative_path"] = os.path.relpath(path.resolve(), home)
            record["folder_name"] = path.resolve().name
    record["fingerprint"] = base_fingerprint(model)
    record["embedding_dim"] = model.get_embedding_dimension()
    return record


def _peft_keys(model, record: dict[str, Any]) -> dict[str, Any]:
    """PEFT's names for the base: ``base_model_name_or_path`` (a public hub id or the relative path) and
    ``revision`` (the hub revision sentence-transformers recorded, not medadapt's weights fingerprint that
    :func:`medadapt.models.set_identity` puts in the same card field)."""
    name = record.get("name")
    card = getattr(model, "model_card_data", None)
    revision = getattr(card, "base_model_revision", None)
    if not (name and revision and getattr(card, "base_model", None) == name
            and revision != getattr(model, "medadapt_revision", None)):
        revision = None
    public = ALIAS_NAMES.get(name.lower(), name) if name else record.get("relative_path")
    return {"base_model_name_or_path": public, "revision": revision}


def save_adapter(model, folder: str | Path, adapter_name: str | list[str] | None = None, *,
                 base: str | None = None, card: dict[str, Any] | None = None) -> Path:
    """Write the medadapt heads of ``model`` (all, or ``adapter_name``) as an adapter-only folder, recording
    ``base`` (default :func:`base_name`) and the ``card`` facts (:func:`medadapt.cards.write_card`). Written to a
    temporary sibling and swapped in whole; ``folder`` follows the output policy (:func:`medadapt.io.check_output`):
    new, empty or an adapter folder. ``ConfigError`` for any other folder, a model without such heads or with a
    PEFT adapter."""
    folder = Path(folder)
    with replace_folder(folder, ADAPTER_FOLDER, what="adapter folder") as tmp:
        write_adapter(model, tmp, adapter_name, base=base, name=folder.name, card=card)
    return folder


def _refuse_peft(model) -> None:
    """A model that also carries a PEFT adapter (LoRA) would lose it in an adapter-only folder and record a
    fingerprint no plain copy of the base matches."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:  # pragma: no cover - peft is a dependency
        return
    if any(isinstance(m, BaseTunerLayer) for m in model.modules()):
        raise ConfigError("the model carries a PEFT adapter (LoRA) besides its medadapt heads: an adapter-only "
                          "folder would not hold it; save the full model (model.save) or merge the LoRA into "
                          "the base first (medadapt.training.lora.merge_lora) and save that base")


def write_adapter(model, folder: str | Path, adapter_name: str | list[str] | None = None, *,
                  base: str | None = None, name: str | None = None, card: dict[str, Any] | None = None,
                  allow_empty: bool = False) -> dict[str, Any]:
    """The files of :func:`save_adapter` in the fresh folder ``folder``, to be called ``name``; returns the
    adapter config. ``allow_empty``: a model without heads too (a composed model whose lexical branch sits
    beside the base). Holds :func:`medadapt.locks.model_lock` (the base's tokenizer is fingerprinted)."""
    with model_lock(model):
        return _write_adapter(model, Path(folder), adapter_name, base, name, card, allow_empty)


def _write_adapter(model, folder: Path, adapter_name, base, name, card, allow_empty) -> dict[str, Any]:
    _refuse_peft(model)
    wanted = None if adapter_name is None else (
        [adapter_name] if isinstance(adapter_name, str) else list(adapter_name))
    heads, tensors = {}, {}
    active = []
    for location, stack in adapter_locations(model):
        for head in stack.names():
            if wanted is not None and head not in wanted:
                continue
            heads[head] = {**stack.spec(head), "location": location}
            for key, value in stack.heads[head].state_dict().items():
                tensors[f"{head}.{key}"] = value.detach().to("cpu").contiguous()
            if head in stack.active and stack.enabled:
                active.append(head)
    if wanted is not None and set(wanted) - set(heads):
        raise ConfigError(f"no medadapt adapter named {sorted(set(wanted) - set(heads))}")
    if not heads and not allow_empty:
        raise ConfigError("the model has no medadapt adapters to save (add one with model.add_adapter)")
    check_finite_tensors(tensors, f"adapter {name or folder.name}")
    atomic_save_tensors(folder / ADAPTER_WEIGHTS, tensors, metadata={"format": "pt"})
    digest = sha256_file(folder / ADAPTER_WEIGHTS)
    record = _base_record(model, folder, base, final=name)
    if not record["name"] and not record["relative_path"]:
        warn(f"adapter {name or folder.name} records no base model: the model has no name or folder to "
             "record (built in memory, or its folder is gone), so the folder loads only onto a model you hold "
             "(model.load_adapter) or with medadapt.load(folder, base=...); pass base=<the base's name or "
             "folder> to save_adapter to record it")
    config = {"format_version": ADAPTER_FORMAT, "library": "medadapt", "medadapt_version": __version__,
              **_peft_keys(model, record), "base_model": record, "adapters": heads, "active": active,
              "weights": {"file": ADAPTER_WEIGHTS, "sha256": digest,
                          "parameters": int(sum(t.numel() for t in tensors.values()))}}
    atomic_write_json(folder / ADAPTER_CONFIG, config)
    write_sums(folder, COVERED)
    atomic_write_json(folder / PEFT_STUB, {"peft_type": PEFT_STUB_MESSAGE, "library": "medadapt",
                                           "medadapt_config": ADAPTER_CONFIG})
    write_card(folder, adapter=config, descriptions=describe_heads(model),
               **{"name": name or folder.name, **(card or {})})
    return config


def describe_heads(model) -> dict[str, str]:
    """One line per medadapt head of ``model`` (its type's ``describe``), for model cards."""
    return {name: adapter_type(stack.types[name]).describe(stack.heads[name])
            for _, stack in adapter_locations(model) for name in stack.names()}


def read_adapter_config(folder: str | Path, *, warn_legacy: bool = True) -> dict[str, Any]:
    """The validated ``medadapt_adapter.json`` of ``folder``, after ``SHA256SUMS`` is checked (a folder of
    format 1 without sums is read with a warning, unless ``warn_legacy`` is off)."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cannot read the adapter config ({exc})") from None
    if not isinstance(config, dict) or config.get("format_version") not in READABLE_FORMATS:
        raise ModelLoadError(f"{path}: not a medadapt adapter config of format "
                             f"{' or '.join(map(str, READABLE_FORMATS))}")
    if config["format_version"] == 1 and not (path.parent / SUMS).is_file():
        if warn_legacy:
            warn(f"adapter {path.parent} was written before {SUMS} existed: its config is not checked; save it "
                 "again (medadapt.save_adapter) to add them")
    else:  # format 2, or sums beside a config claiming format 1: checked either way
        try:  # the sums are checked before the parsed config is used
            verify_sums(path.parent, cover=COVERED)
        except ChecksumError as exc:
            raise ModelLoadError(f"adapter {path.parent}: {exc}; re-download or re-train the adapter") from None
    for key in ("base_model", "adapters", "weights"):
        if not isinstance(config.get(key), dict):
            raise ModelLoadError(f"{path}: missing {key!r}")
    return config


def _verified_weights(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    weights = config["weights"]
    path = folder / str(weights.get("file", ADAPTER_WEIGHTS))
    if path.parent != folder:
        raise ModelLoadError(f"{folder / ADAPTER_CONFIG}: weights file must be inside the adapter folder")
    if not path.is_file():
        raise ModelLoadError(f"{folder}: the adapter weights file {path.name} is missing")
    if config["format_version"] != 1:  # SHA256SUMS covered it when the config was read: no second hash
        return load_file(str(path))
    if sha256_file(path) != weights.get("sha256"):
        raise ModelLoadError(f"{path}: checksum mismatch (the file is truncated or was modified); "
                             "re-download or re-train the adapter")
    return load_file(str(path))


def load_adapter(model, folder: str | Path, adapter_name: str | None = None, *, check_base: bool = True,
                 **_: Any) -> list[str]:
    """Load the heads of adapter folder ``folder`` onto ``model`` (``SentenceTransformer.load_adapter``); returns
    their names. The checksums and ``model``'s base fingerprint are checked first; on any error the model is left
    as it was. ``adapter_name`` renames a single-head adapter; the saved active heads become the active ones."""
    folder = Path(folder)
    config = read_adapter_config(folder)
    base = config["base_model"]
    if check_base:
        found = base_fingerprint(model, version=config["format_version"])
        if found != base.get("fingerprint"):
            named = base.get("name") or base.get("folder_name") or "its base model"
            raise ModelLoadError(
                f"adapter {folder} was trained on {named} (weights fingerprint {base.get('fingerprint')}); "
                f"this model's backbone differs (fingerprint {found}): load it onto the same base model")
    heads = config["adapters"]
    if adapter_name is not None and len(heads) != 1:
        raise ConfigError(f"adapter_name renames a single-head adapter; {folder} holds {sorted(heads)}")
    rename = {old: (adapter_name or old) for old in heads}
    taken = [n for n in rename.values() if n in adapter_names(model) or n in _peft_names(model)]
    if taken:
        raise ConfigError(f"the model already has adapter(s) named {taken}; pass adapter_name=...")
    state = _verified_weights(folder, config)
    built = {}
    for old, spec in heads.items():  # build and fill every head before touching the model
        kind = adapter_type(str(spec.get("type")))
        dim = base.get("embedding_dim") if spec.get("location", "all") == "all" else None
        head = kind.from_dict(spec["config"], dim or _config_dim(spec["config"]))
        part = {k[len(old) + 1:]: v for k, v in state.items() if k.startswith(old + ".")}
        try:
            head.load_state_dict(part, strict=True)
        except RuntimeError as exc:
            raise ModelLoadError(f"{folder}: weights of adapter {old!r} do not match its config ({exc})") \
                from None
        built[old] = (head, kind.name, spec.get("location", "all"))
    for old, (head, _, location) in built.items():  # every width checked before the model changes
        width = _location_dim(model, location)
        if getattr(head, "get_embedding_dimension", None) and head.get_embedding_dimension() != width:
            raise ModelLoadError(f"adapter {old!r} is {head.get_embedding_dimension()}-d but the model's "
                                 f"{location} embedding is {width}-d")
    for old, (head, type_name, location) in built.items():
        stack = stack_for(model, None if location == "all" else location, create=True)
        stack.add(rename[old], head.to(model.device), type_name)
    active = [rename[n] for n in config.get("active", []) if n in rename] or list(rename.values())
    set_active(model, active)
    return list(rename.values())


def _config_dim(config: dict[str, Any]) -> int:
    dim = config.get("dim") if isinstance(config, dict) else None
    if not isinstance(dim, int):
        raise ModelLoadError("adapter config has no embedding dimension")
    return dim


def _base_candidates(folder: Path, record: dict[str, Any]) -> list[str]:
    """Where the recorded base is looked for, in order: the folder at its relative path, an alias whose
    public name is the recorded hub id (packaged, offline), the recorded name."""
    found = []
    relative = record.get("relative_path")
    if relative and (folder / relative).is_dir():
        found.append(str((folder / relative).resolve()))
    name = record.get("name")
    if name:
        found += [*_aliases_named(str(name)), str(name)]
    return found


def load_adapter_model(folder: str | Path, load, base: str | None = None, device: str | None = None,
                       **kwargs):
    """Load the base model an adapter folder names (or ``base``) with ``load`` (``medadapt.load``, which
    calls this for adapter folders) and the adapter onto it. Of several places the base may be
    (:func:`_base_candidates`), the first whose fingerprint matches is used."""
    folder = Path(folder)
    config = read_adapter_config(folder, warn_legacy=False)  # load_adapter below warns once
    record = config["base_model"]
    candidates = [base] if base is not None else _base_candidates(folder, record)
    if not candidates:
        if record.get("relative_path"):
            raise ModelLoadError(
                f"adapter {folder} was trained on a local model folder "
                f"({record.get('folder_name') or record.get('relative_path')}) that is not at its recorded "
                "place; pass base=<that folder>")
        raise ModelLoadError(f"adapter {folder} records no base model (it was saved from a model without a "
                             "name or folder); pass base=<the base model's name or folder>")
    for i, candidate in enumerate(candidates):
        last = i == len(candidates) - 1
        try:
            model = load(candidate, device=device, **kwargs)
        except ModelLoadError:
            if last:
                raise
            continue
        if last or base_fingerprint(model, version=config["format_version"]) == record.get("fingerprint"):
            break
    load_adapter(model, folder)
    return model
