"""Plain mistakes and hostile model folders give one clear :class:`ModelLoadError` (issue 43 items 2 and 5):
a name that looks like a path is checked on disk first (no hub lookup, the closest folders suggested), a
pickle-only folder, a ``modules.json`` naming something that is no module class, and JSON nested 100,000
levels deep are refused before anything is constructed, and nothing in them runs."""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import medadapt
import medadapt.adapters  # noqa: F401 - patches SentenceTransformer before a test replaces it
from medadapt.cli import app
from medadapt.errors import ModelLoadError
from medadapt.models import pickled_weights, resolve_model_path

pytestmark = pytest.mark.usefixtures("_single_thread")


class _Constructions:
    """Stands in for ``SentenceTransformer``: records every construction (a hub lookup would start there)."""

    calls: list = []

    def __init__(self, name, **kwargs):
        _Constructions.calls.append(name)


@pytest.fixture
def no_construction(monkeypatch):
    import sentence_transformers

    _Constructions.calls = []
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", _Constructions)
    yield _Constructions.calls


def _copy(tiny_bert_dir: Path, folder: Path) -> Path:
    shutil.copytree(tiny_bert_dir, folder)
    return folder


# ---------------------------------------------------------------------------------- names like paths
@pytest.mark.parametrize("name, needles", [
    ("runs/dem", ["did you mean 'runs/demo' or 'runs/demo-2'?", "'runs/' is a folder here"]),
    ("./runs/dem", ["did you mean 'runs/demo' or 'runs/demo-2'?"]),
    ("runs/dem/0_Transformer", ["did you mean 'runs/demo' or 'runs/demo-2'?"]),
    ("runs/demo/../other", ["does not exist"]),
    ("../no-such-folder-medadapt/x", ["does not exist (aliases: "]),
    ("/no-such-folder-medadapt/x", ["does not exist (aliases: "]),
    ("~/no-such-folder-medadapt", ["does not exist (aliases: "]),
    ("a/b/c", ["does not exist"]),
    ("my model", ["no valid Hugging Face hub id"]),
    ("runs\\dem", ["does not exist"]),
    ("", ["the model name is empty"]),
])
def test_a_missing_path_is_one_error_without_a_hub_lookup(name, needles, tmp_path, monkeypatch, no_construction):
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    (tmp_path / "runs" / "demo-2").mkdir()
    (tmp_path / "runs" / "zzz").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as err:
        medadapt.load(name, device="cpu")
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message
    assert "zzz" not in message  # only close names are suggested
    assert no_construction == []  # refused before sentence-transformers (and the hub) saw the name


def test_hub_ids_still_reach_the_hub(tmp_path, monkeypatch, no_construction):
    monkeypatch.chdir(tmp_path)  # no folder "org" here
    assert resolve_model_path("org/some-model") == "org/some-model"
    assert resolve_model_path("bert-base-uncased") == "bert-base-uncased"
    medadapt.load("org/some-model", device="cpu")
    assert no_construction == ["org/some-model"]


def test_cli_mistyped_model_path_is_one_fast_line(tiny_beir_dir, tmp_path, monkeypatch):
    (tmp_path / "runs" / "demo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEDADAPT_CACHE", str(tmp_path / "cache"))
    res = CliRunner().invoke(app, ["eval", "--model", "runs/dem", "--data", str(tiny_beir_dir), "-q"])
    assert res.exit_code == 1
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == ["error: model path 'runs/dem' does not exist (did you mean 'runs/demo'?); 'runs/' is a folder "
                     "here, so this is read as a path in it, not as a hub id"], res.output


# ----------------------------------------------------------------------------------- pickled weights
class _Evil:
    """Unpickling it would call ``open(marker, "w")``: the marker file shows that pickle code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("where", ["pytorch_model.bin", "pytorch_model-00001-of-00002.bin",
                                   "1_Pooling/pytorch_model.bin", "adapter_model.bin"])
def test_pickle_only_weights_are_refused_before_unpickling(where, tiny_bert_dir, tmp_path):
    folder = _copy(tiny_bert_dir, tmp_path / "pickled")
    marker = tmp_path / "UNPICKLED"
    if where.startswith("pytorch_model"):
        (folder / "model.safetensors").unlink()  # the weights are only the pickle
    (folder / where).write_bytes(pickle.dumps({"w": _Evil(marker)}))
    assert pickled_weights(folder) == where
    with pytest.raises(ModelLoadError) as err:
        medadapt.load(str(folder), device="cpu")
    message = str(err.value)
    assert f"holds its weights as a pickle file ({where})" in message and "trust_remote_code=True" in message
    assert "\n" not in message and not marker.exists()


def test_pickle_beside_safetensors_loads_and_an_explicit_trust_loads_a_pickle(tiny_bert, tiny_bert_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    both = _copy(tiny_bert_dir, tmp_path / "both")
    marker = tmp_path / "UNPICKLED"
    (both / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Evil(marker)}))  # safetensors is preferred
    assert pickled_weights(both) is None
    texts = ["gout toe pain", "asthma inhaler"]
    np.testing.assert_allclose(medadapt.load(str(both), device="cpu").encode(texts), tiny_bert.encode(texts),
                               atol=1e-6)
    assert not marker.exists()
    only = _copy(tiny_bert_dir, tmp_path / "only")
    torch.save(load_file(only / "model.safetensors"), only / "pytorch_model.bin")
    (only / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="pickle file"):
        medadapt.load(str(only), device="cpu")
    model = medadapt.load(str(only), device="cpu", trust_remote_code=True)  # the user's explicit decision
    np.testing.assert_allclose(model.encode(texts), tiny_bert.encode(texts), atol=1e-6)


# ----------------------------------------------------------------------- names that are no module class
@pytest.mark.parametrize("ref, patched", [
    ("os.system", "os.system"),
    ("builtins.print", None),
    ("sentence_transformers.util.http_get", "sentence_transformers.util.http_get"),
    ("sentence_transformers.SentenceTransformer", None),  # a whole model, not a module
    ("sentence_transformers.util", None),  # a package
    ("sentence_transformers.__main__.main", None),
    ("sentence_transformers.no_such_thing.Module", None),
])
@pytest.mark.parametrize("trust", [None, True])
def test_a_name_that_is_no_module_class_is_one_error_and_nothing_is_called(ref, patched, trust, tiny_bert_dir,
                                                                            tmp_path, monkeypatch):
    calls = []
    if patched:
        monkeypatch.setattr(patched, lambda *a, **k: calls.append(a))
    folder = _copy(tiny_bert_dir, tmp_path / "odd")
    modules = json.loads((folder / "modules.json").read_text())
    modules[2]["type"] = ref
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelLoadError) as err:
        medadapt.load(str(folder), device="cpu", trust_remote_code=trust)
    assert "\n" not in str(err.value) and (ref in str(err.value) or "has no attribute 'load'" in str(err.value))
    assert calls == []


# ------------------------------------------------------------------------------------- nested JSON
@pytest.mark.parametrize("name", ["modules.json", "1_Pooling/config.json", "config.json", "tokenizer_config.json",
                                  "config_sentence_transformers.json"])
def test_json_nested_100k_deep_is_one_error(name, tiny_bert_dir, tmp_path):
    folder = _copy(tiny_bert_dir, tmp_path / "deep")
    depth = 100_000
    text = "[" * depth + "]" * depth if name == "modules.json" else '{"a":' * depth + "1" + "}" * depth
    (folder / name).write_text(text)
    with pytest.raises(ModelLoadError) as err:
        medadapt.load(str(folder), device="cpu")
    assert "\n" not in str(err.value) and ("nested too deeply" in str(err.value)
                                          or "recursion" in str(err.value)), str(err.value)


def test_router_config_nested_deep_is_one_error(tiny_bert_dir, tmp_path):
    from medadapt.models import module_classes

    folder = _copy(tiny_bert_dir, tmp_path / "router")
    (folder / "router_config.json").write_text('{"types":' * 50_000 + "{}" + "}" * 50_000)
    with pytest.raises(ModelLoadError, match="nested too deeply"):
        module_classes(folder)
    assert os.path.isdir(folder)
