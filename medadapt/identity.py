"""Identity: the fingerprints that key caches, adapter folders and checkpoints, in one place.

* :func:`sha256_file`: a file's bytes.
* :func:`tokenizer_fingerprint`: what a tokenizer does to text. Behavioural: the vocabulary, the special tokens,
  the padding side and the ids of fixed probe texts, so the same tokenizer gives the same fingerprint whatever
  class or ``tokenizers`` version loaded it, while lowercasing, another vocabulary or another pre-tokeniser
  changes it (neither transformers nor tokenizers offers a content hash of a tokenizer).
* :func:`model_fingerprint` / :func:`modules_fingerprint`: a SentenceTransformer's (or a list of its modules')
  types, configurations, tokenizers and weights; :func:`backend_key`: the graph behind a transformer that runs
  on ONNX / OpenVINO (:mod:`medadapt.backends`), which holds no torch weights.

Below the cache, the loader and the adapters, so each of them can key what it stores without importing the
others.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from medadapt.errors import MedAdaptError

__all__ = ["PROBES", "backend_key", "model_fingerprint", "modules_fingerprint", "sha256_file",
           "tokenizer_fingerprint"]


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


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
    """The vocabulary as one JSON text in id order (tokens by id when the ids are dense, the usual case:
    a list indexed by id is ~3x faster to build than sorting the pairs)."""
    ids = list(vocab.values())
    if ids and min(ids) >= 0 and max(ids) < 2 * len(ids):
        by_id: list = [None] * (max(ids) + 1)
        for token, i in vocab.items():
            by_id[i] = token
        return json.dumps(by_id, ensure_ascii=False)
    return json.dumps(sorted(vocab.items(), key=lambda kv: (kv[1], kv[0])), ensure_ascii=False)


def tokenizer_fingerprint(tokenizer) -> str:
    """A stable identity of what ``tokenizer`` does to text (module docstring)."""
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
    """A stable identity for a SentenceTransformer's modules, their configuration and weights.

    Hashes every parameter's bytes for models up to ``full_hash_max_params`` parameters; above that, a
    hash of each tensor's name, shape, and a strided sample of its values (fast for multi-billion LLMs,
    still changes when training changes the weights).
    """
    return modules_fingerprint(list(getattr(model, "_modules", {}).values()), full_hash_max_params)


def modules_fingerprint(modules, full_hash_max_params: int = 300_000_000) -> str:
    """:func:`model_fingerprint` of a list of modules (e.g. a model's backbone without its heads): their
    types and configurations, the :func:`tokenizer_fingerprint` of any tokenizer they hold, and weights."""
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
    """What the embedding cache adds to a backbone's fingerprint for its backend: ``""`` when every
    transformer runs on torch (torch namespaces unchanged), else ``"<backend>:<source>:<file sha256>"`` per
    swapped transformer. A sentence-transformers ONNX / OpenVINO model not loaded through medadapt is keyed
    by the hash of its graph file; one whose file cannot be found is refused (its weights cannot be told
    apart from another model's: the graph holds no torch parameters to hash)."""
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
