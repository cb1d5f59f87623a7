"""Identity: the fingerprints that key caches, adapter folders, exports and checkpoints, in one place.

Files (:func:`sha256_file`), tokenizers (:func:`tokenizer_fingerprint`, behavioural), models and their
modules (:func:`model_fingerprint`, :func:`modules_fingerprint`, :func:`backend_key`), JSON keys
(:func:`json_fingerprint`) and training runs (:func:`run_fingerprint`). Below the cache, the loader, the
backends and the adapters, so each can key what it stores without importing the others.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from medadapt.errors import MedAdaptError

__all__ = ["PROBES", "backend_key", "json_fingerprint", "model_fingerprint", "modules_fingerprint",
           "run_fingerprint", "sha256_file", "tokenizer_fingerprint", "weights_version"]


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def json_fingerprint(obj, length: int = 32) -> str:
    """SHA-256 of ``obj`` as JSON with sorted keys (other values as ``str``), its first ``length`` hex digits."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:length]


#: Texts whose token ids enter the fingerprint (what differs between normalisers and pre-tokenisers).
PROBES = (
    "What are the Symptoms of GOUT? Uric-acid crystals; 2,500 mg/dL at 37.5°C.",
    "Café naïve Ångström résumé ÆØ ß İ",
    "高血压患者应该注意什么？糖尿病、心脏病。",
    "antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "  multiple   spaces\tand\ttabs\nnew line  ",
    "[CLS] <s> </s> <|endoftext|> [MASK] <unk> #hashtag @user e-mail@example.org https://x.y/z?a=1",
    "ÉMOJI 😀 ☺ ﬁ ① Ⅻ ｆｕｌｌｗｉｄｔｈ",
)


def _vocab_text(vocab: dict[str, int]) -> str:
    """The vocabulary as one JSON text in id order (a list indexed by id when the ids are dense: ~3x faster
    than sorting the pairs)."""
    ids = list(vocab.values())
    if ids and min(ids) >= 0 and max(ids) < 2 * len(ids):
        by_id: list = [None] * (max(ids) + 1)
        for token, i in vocab.items():
            by_id[i] = token
        return json.dumps(by_id, ensure_ascii=False)
    return json.dumps(sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])), ensure_ascii=False)


def tokenizer_fingerprint(tokenizer) -> str:
    """What ``tokenizer`` does to text: its vocabulary, special tokens, padding side and the ids of
    :data:`PROBES`, so the same tokenizer gives the same fingerprint whatever class or ``tokenizers`` version
    loaded it, while lowercasing, another vocabulary or pre-tokeniser changes it (no library offers one)."""
    h = hashlib.sha256(b"medadapt-tokenizer-1")
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if callable(get_vocab) else {}
    h.update(_vocab_text(vocab).encode("utf-8", "surrogatepass"))
    special = getattr(tokenizer, "special_tokens_map", {}) or {}
    h.update(json.dumps({"padding_side": getattr(tokenizer, "padding_side", None),
                         "special": {k: str(v) for k, v in sorted(special.items())}},
                        sort_keys=True, ensure_ascii=False).encode("utf-8"))
    try:
        ids = [tokenizer(text, add_special_tokens=True, truncation=False)["input_ids"] for text in PROBES]
    except Exception as exc:  # noqa: BLE001 - a tokenizer that cannot encode the probes still has a vocabulary
        ids = [type(exc).__name__]
    h.update(json.dumps(ids).encode("utf-8"))
    return h.hexdigest()[:24]


def model_fingerprint(model, full_hash_max_params: int = 300_000_000) -> str:
    """A SentenceTransformer's identity: :func:`modules_fingerprint` of all its modules."""
    return modules_fingerprint(list(getattr(model, "_modules", {}).values()), full_hash_max_params)


def modules_fingerprint(modules, full_hash_max_params: int = 300_000_000) -> str:
    """A list of modules' types, configurations, tokenizers (:func:`tokenizer_fingerprint`) and weights:
    every parameter's bytes up to ``full_hash_max_params`` parameters, above that a strided sample of each
    tensor (fast for multi-billion LLMs, still changed by training)."""
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
        seen: set[int] = set()  # a Router's routes each hold a Transformer with its own tokenizer
        for sub in module.modules() if isinstance(module, torch.nn.Module) else [module]:
            tokenizer = getattr(sub, "tokenizer", None)
            if tokenizer is not None and id(tokenizer) not in seen:  # same weights, other tokens: other vectors
                seen.add(id(tokenizer))
                h.update(f"tokenizer:{tokenizer_fingerprint(tokenizer)}".encode())
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
    key = backend_key(modules)  # an ONNX / OpenVINO transformer holds no torch weights: its graph's identity
    if key:  # "" on torch: fingerprints of torch models are unchanged
        h.update(f"backend:{key}".encode())
    return h.hexdigest()[:24]


def backend_key(modules) -> str:
    """What a backbone's fingerprint adds for its backend: ``""`` on torch, else per swapped transformer
    ``"<backend>:<source>:<file sha256>"`` (a sentence-transformers ONNX / OpenVINO model: its graph file's
    hash; refused when that file cannot be found, as the graph holds no torch weights to hash)."""
    from sentence_transformers.base.modules import Transformer

    keys = []
    for top in modules:
        for module in top.modules():
            if not isinstance(module, Transformer):
                continue
            inner = module.model
            key = getattr(inner, "medadapt_backend_key", None)  # a medadapt.backends.BackendModel
            if isinstance(key, str):
                keys.append(key)
                continue
            if getattr(module, "backend", "torch") == "torch":
                continue
            path = getattr(inner, "model_path", None) or getattr(inner, "model_save_dir", None)
            path = Path(str(path)) if path else None
            if path is not None and path.is_dir():
                files = sorted([*path.glob("*.onnx"), *path.glob("*.xml")])
                path = files[0] if files else None
            if path is None or not path.is_file():
                raise MedAdaptError(f"cannot identify the weights of this {module.backend} model for the "
                                    "embedding cache; load it with medadapt.load(..., backend=...)")
            keys.append(f"{module.backend}:{sha256_file(path)}")
    return "|".join(keys)


def run_fingerprint(recipe) -> str:
    """A training run's identity (kept in its checkpoints): the recipe's ``training_identity()`` and the
    names, sizes and modification times of the local files and folders it names (data, model folders), so a
    run never resumes the checkpoint of a run on other data or weights."""
    return json_fingerprint([recipe.training_identity(), _data_signature(recipe)])


def _data_signature(recipe) -> list:
    out = []
    seen: set[Path] = set()
    for value in _paths(recipe.model_dump(mode="json", exclude={"eval", "name", "description"})):
        try:
            path = recipe.resolve(value)
            if path in seen or not path.exists():
                continue
        except (OSError, ValueError):
            continue
        seen.add(path)
        files = _first_files(path) if path.is_dir() else [path]
        out += [(str(p.relative_to(path)) if path.is_dir() else p.name, p.stat().st_size, p.stat().st_mtime_ns)
                for p in files]
    return out


def _first_files(folder: Path, limit: int = 256) -> list[Path]:
    """The first ``limit`` files under ``folder`` in sorted walk order (a huge folder costs no full listing)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        found += [Path(root) / f for f in sorted(files)]
        if len(found) >= limit:
            break
    return found[:limit]


def _paths(obj, key: str | None = None) -> Iterator[str]:
    """Every string of a recipe dump that may name a local file or folder (the caller skips missing ones)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, k)
    elif isinstance(obj, list):
        for v in obj:
            yield from _paths(v, key)
    elif isinstance(obj, str) and obj.strip() not in ("", ".", "..") and len(obj) < 4096 and "\n" not in obj:
        yield obj


def weights_version(modules: Sequence, norms: bool = True) -> tuple | None:
    """What changes whenever a parameter or buffer of ``modules`` is written: each tensor's identity, storage
    and in-place version counter, and its L2 norm in float64 (``None`` where a tensor keeps no counter, e.g.
    an inference-mode tensor: then nothing is memoised).

    The counter sees every autograd-visible write (optimiser steps, ``load_state_dict``); the norm sees
    writes through ``tensor.data``, which bypass the counter (one fused pass, ~4 ms for MiniLM's embeddings
    and a layer on 2 CPU cores, where a full SHA-256 fingerprint takes ~80 ms). A write that only permutes
    or flips signs of values inside one tensor through ``.data`` keeps the norm and is not seen.
    ``norms=False`` skips the norms (counters only: writes through ``.data`` go unseen) where the check sits on
    a per-query path (the norms of all of MiniLM take ~56 ms on 2 CPU cores)."""
    import torch

    out, floats = [], []
    for module in modules:
        for t in (*module.parameters(), *module.buffers()):
            try:
                out.append((id(t), t.data_ptr(), t._version))
            except RuntimeError:
                return None
            if norms and t.is_floating_point() and t.numel():
                wide = torch.float32 if t.device.type == "mps" else torch.float64  # MPS has no float64
                floats.append(torch.linalg.vector_norm(t.detach(), dtype=wide).reshape(1).cpu())
    norms = tuple(torch.cat(floats).tolist()) if floats else ()
    return (tuple(out), norms)
