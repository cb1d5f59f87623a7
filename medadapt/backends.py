"""CPU inference backends for the transformer of a loaded model: ``torch`` (default), ``onnx``, ``onnx-int8``
(ONNX Runtime dynamic quantisation) and ``openvino``.

``medadapt.load(name, backend=...)`` swaps the weights inside every ``Transformer`` module for an exported
graph (:class:`BackendModel`); the rest stays torch. Exports are made once per source weights under
``<cache>/exports/<fingerprint>/``, checked against torch and by SHA-256; each backend has its own fingerprint
(:func:`medadapt.identity.backend_key`). Hand-written because sentence-transformers' backends need optimum,
which pins an older transformers. Details and limits: docs/cache.md, "CPU backends".
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from medadapt.cache import default_cache_dir, namespace_lock
from medadapt.errors import MedAdaptError, ModelLoadError, warn
from medadapt.identity import modules_fingerprint, sha256_file
from medadapt.io import atomic_write_json, file_mode

#: Valid backend names; extra and import names of what each needs beyond medadapt's own dependencies.
BACKENDS: dict[str, dict[str, Any]] = {
    "torch": {"extra": None, "modules": ()},
    "onnx": {"extra": "onnx", "modules": ("onnx", "onnxruntime")},
    "onnx-int8": {"extra": "onnx", "modules": ("onnx", "onnxruntime", "onnxruntime.quantization")},
    "openvino": {"extra": "openvino", "modules": ("onnx", "openvino")},
}
_FILES = {"onnx": "model.onnx", "onnx-int8": "model.int8.onnx", "openvino": "model.onnx"}
_EXPORT_TOLERANCE = 1e-3  # max |onnx - torch| on the check batch's real tokens (float export: ~1e-6)
_CHECK_TEXTS = ("a", "Diabetes mellitus is a group of metabolic disorders characterised by high blood sugar.",
                "What are the symptoms of glaucoma?")


def check_backend(name: str) -> str:
    """``name`` if it is a backend medadapt knows, else one :class:`MedAdaptError` listing the valid ones."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise MedAdaptError(f"unknown backend {name!r} (valid: {', '.join(BACKENDS)})")
    return name


def require_backend(name: str) -> None:
    """Import what backend ``name`` needs; a missing package is one :class:`MedAdaptError` naming the extra."""
    spec = BACKENDS[check_backend(name)]
    for module in spec["modules"]:
        try:
            importlib.import_module(module)
        except ImportError:
            root = module.split(".")[0]
            raise MedAdaptError(
                f"backend {name!r} needs the {root!r} package, which is not installed: "
                f"pip install 'medadapt[{spec['extra']}]'"
            ) from None


def export_root() -> Path:
    """Where exported graphs are kept: ``<embedding cache dir>/exports``."""
    return default_cache_dir() / "exports"


class BackendModel:
    """Marker base of the parameter-free module that stands in for a ``Transformer``'s Hugging Face model
    (:func:`_make_backend_model`): its ``forward`` runs the graph, ``medadapt_backend_key`` is its cache key."""


def _make_backend_model(backend: str, path: Path, config, input_names: list[str], key: str,
                        threads: int | None):
    import numpy as np
    import torch

    if backend == "openvino":
        import openvino as ov

        core = ov.Core()
        ov_config = {"INFERENCE_NUM_THREADS": int(threads)} if threads else {}
        compiled = core.compile_model(str(path), "CPU", ov_config)
        output = compiled.output(0)

        def run(feeds):
            return compiled(feeds)[output]
    else:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = int(threads)
            options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])

        def run(feeds):
            return session.run(None, feeds)[0]

    class BackendGraph(torch.nn.Module, BackendModel):
        def __init__(self):
            super().__init__()
            self.config = config
            self.backend = backend
            self.model_path = str(path)
            self.medadapt_backend_key = key

        @property
        def device(self):
            return torch.device("cpu")

        def forward(self, input_ids, attention_mask=None, token_type_ids=None):
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
            feeds = {}
            for name in input_names:
                value = given.get(name)
                if value is None:  # e.g. no token_type_ids from this tokenizer: zeros, as BERT defaults
                    value = torch.zeros_like(input_ids)
                feeds[name] = np.ascontiguousarray(value.detach().cpu().numpy().astype(np.int64))
            return {"last_hidden_state": torch.from_numpy(np.asarray(run(feeds), dtype=np.float32))}

        def save_pretrained(self, *args, **kwargs):
            raise MedAdaptError(f"a model running on the {backend!r} backend cannot be saved; load it with "
                                "backend='torch' to save or train it")

        def extra_repr(self) -> str:
            return f"backend={backend!r}, file={self.model_path!r}"

    return BackendGraph()


def _transformers(model) -> list:
    """Every sentence-transformers ``Transformer`` module of ``model`` (top level, in ``Router`` routes)."""
    from sentence_transformers.base.modules import Transformer

    return [m for m in model.modules() if isinstance(m, Transformer)]


def _input_names(transformer, features: dict) -> list[str]:
    import inspect

    params = set(inspect.signature(transformer.model.forward).parameters)
    return [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in features and n in params]


def _export_onnx(transformer, target: Path) -> list[str]:
    """Export ``transformer``'s model to ``target``, checked against torch on other shapes; its input names."""
    import numpy as np
    import torch

    hf = copy.deepcopy(transformer.model).to("cpu").eval()
    try:  # eager attention traces to plain ops on every transformers version
        hf.set_attn_implementation("eager")
    except Exception:  # noqa: BLE001 - older transformers / models without the switch: export as is
        pass
    trace = transformer.preprocess(["a short text", "a longer text, so that the batch needs padding here"])
    names = _input_names(transformer, trace)
    if "input_ids" not in names:
        raise ModelLoadError("the onnx backend needs a text model that takes input_ids")

    class _Graph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.hf = hf

        def forward(self, *args):
            return self.hf(**dict(zip(names, args)), return_dict=True)["last_hidden_state"]

    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Graph(), tuple(trace[n] for n in names), str(target), input_names=names,
                          output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17,
                          dynamo=False)
    extra = [p.name for p in target.parent.iterdir() if p != target]
    if extra:
        raise ModelLoadError("the onnx backend supports models whose graph fits one .onnx file (under 2 GB)")
    check = transformer.preprocess(list(_CHECK_TEXTS))
    got = _run_check(target, names, check)
    with torch.no_grad():
        want = transformer.model(**{n: check[n] for n in names}, return_dict=True)["last_hidden_state"].numpy()
    mask = check["attention_mask"].numpy().astype(bool)
    err = float(np.abs(got - want)[mask].max())
    if not err <= _EXPORT_TOLERANCE:
        raise ModelLoadError(f"the ONNX export does not reproduce the torch model (max difference {err:.2e}); "
                             "use backend='torch' for this model")
    return names


def _run_check(path: Path, names: list[str], features: dict):
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {n: features[n].numpy() for n in names})[0]


def _quantize(source: Path, target: Path) -> None:
    """ONNX Runtime's int8 dynamic quantisation (weights per channel, activations at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import logging

    logging.disable(logging.WARNING)  # onnxruntime logs a pre-processing hint on the root logger
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=True,
                             op_types_to_quantize=["MatMul", "Gemm"])
    finally:
        logging.disable(logging.NOTSET)


def _build(folder: Path, name: str, meta: dict, make) -> None:
    """``make(tmp)`` writes the file in a temporary folder beside it; it is renamed to ``folder/name`` and
    its hash recorded in ``meta.json``."""
    work = Path(tempfile.mkdtemp(prefix=".export-", dir=folder))
    try:
        make(work / name)
        os.chmod(work / name, file_mode())
        os.replace(work / name, folder / name)
        meta.setdefault("files", {})[name] = sha256_file(folder / name)
        atomic_write_json(folder / "meta.json", meta)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _read_meta(folder: Path) -> dict:
    try:
        data = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _valid(folder: Path, name: str, meta: dict) -> bool:
    path = folder / name
    want = (meta.get("files") or {}).get(name)
    return path.is_file() and want is not None and sha256_file(path) == want


def ensure_export(transformer, backend: str, fingerprint, root: Path | None = None) -> tuple[Path, list[str], str]:
    """``(graph file, input names, source fingerprint)`` for ``transformer`` on ``backend``, exported (and
    quantised) once per source weights under the folder's lock; ``fingerprint(modules)`` names the folder."""
    source = fingerprint([transformer])
    folder = (root or export_root()) / source
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MedAdaptError(f"cannot write the export folder {folder}: {exc.strerror or exc}") from None
    name = _FILES[backend]
    with namespace_lock(folder):
        meta = _read_meta(folder)
        if not _valid(folder, name, meta) and (folder / name).exists():
            warn(f"exported model {folder / name} fails its checksum; exporting it again")
        if not _valid(folder, "model.onnx", meta):
            meta = {"source_fingerprint": source, "format": 1, "files": {}}
            _build(folder, "model.onnx", meta, lambda tmp: meta.update(inputs=_export_onnx(transformer, tmp)))
        if name != "model.onnx" and not _valid(folder, name, meta):
            _build(folder, name, meta, lambda tmp: _quantize(folder / "model.onnx", tmp))
        names = list(meta.get("inputs") or ["input_ids", "attention_mask"])
    return folder / name, names, source


def apply_backend(model, backend: str, *, fingerprint=modules_fingerprint, threads: int | None = None,
                  root: Path | None = None):
    """Run every ``Transformer`` module of ``model`` (loaded with torch) on ``backend``, in place; returns
    ``model``. ``threads``: the runtime's intra-op threads (default ``torch.get_num_threads()``); ``root``:
    export folder (default :func:`export_root`)."""
    check_backend(backend)
    if backend == "torch":
        return model
    require_backend(backend)
    dev = str(getattr(model, "device", "cpu"))
    if not dev.startswith("cpu"):
        raise MedAdaptError(f"backend {backend!r} runs on the CPU; the model is on {dev} (use --device cpu or "
                            "--backend torch)")
    transformers = _transformers(model)
    if not transformers:
        raise MedAdaptError(f"backend {backend!r}: the model has no sentence-transformers Transformer module")
    import inspect

    import torch

    threads = threads or torch.get_num_threads()
    for transformer in transformers:
        if getattr(transformer, "backend", "torch") != "torch" or isinstance(transformer.model, BackendModel):
            raise MedAdaptError(f"backend {backend!r}: the model already runs on {transformer.backend!r}")
        text = (getattr(transformer, "modality_config", None) or {}).get("text") or {}
        if (getattr(transformer, "transformer_task", "feature-extraction") != "feature-extraction"
                or text.get("method", "forward") != "forward"
                or text.get("method_output_name", "last_hidden_state") not in ("last_hidden_state",
                                                                               ["last_hidden_state"])):
            raise MedAdaptError(f"backend {backend!r} supports text feature-extraction transformers that "
                                f"output last_hidden_state (this one: {transformer.transformer_task!r}, {text})")
        path, names, source = ensure_export(transformer, backend, fingerprint, root)
        key = f"{backend}:{source}:{sha256_file(path)}"
        runner = _make_backend_model(backend, path, transformer.model.config, names, key, threads)
        transformer.model = runner  # the torch weights are released
        transformer.backend = "openvino" if backend == "openvino" else "onnx"
        signature = inspect.signature(runner.forward)
        transformer._declared_forward_params = set(signature.parameters)
        transformer.model_forward_params = set(signature.parameters)
        transformer._method_signature_cache.clear()
    model.backend = "openvino" if backend == "openvino" else "onnx"
    model._medadapt_backend = backend
    old = getattr(model, "medadapt_revision", None)
    if old is not None:  # the identity set by medadapt.models.set_identity names the backend too
        model.medadapt_revision = fingerprint(list(model._modules.values()))  # = model_fingerprint(model)
        card = getattr(model, "model_card_data", None)
        if card is not None and getattr(card, "base_model_revision", None) == old:
            card.base_model_revision = model.medadapt_revision
    return model

