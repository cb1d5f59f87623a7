"""CPU backends (``medadapt.load(..., backend=...)``, ``--backend``): ONNX / int8 / OpenVINO embeddings
against torch on a tiny random BERT, one export per weights, heads on top, separate cache keys, and the
errors for an unknown backend or a missing package."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import medadapt
from medadapt.backends import BACKENDS, BackendModel, export_root
from medadapt.cache import EmbeddingCache
from medadapt.errors import MedAdaptError

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
pytestmark = pytest.mark.usefixtures("_single_thread", "_isolated_cache")

TEXTS = ["gout", "what are the symptoms of asthma? wheezing inhaler airway breath cough",
         "migraine is a condition with headache aura light nausea throbbing. treatment of migraine depends",
         "zzz unseen qqq words split into letters"]


def _enc(model):
    return np.asarray(model.encode(TEXTS, batch_size=3, convert_to_numpy=True))  # two batches, padding


def test_onnx_equals_torch_and_exports_once(tiny_bert_dir, monkeypatch):
    ref = _enc(medadapt.load(str(tiny_bert_dir), device="cpu"))
    model = medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx")
    assert isinstance(model[0].model, BackendModel) and model[0].backend == "onnx"
    assert sum(p.numel() for p in model.parameters()) == 0  # the torch weights are gone
    got = _enc(model)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=1e-4)
    folders = list(export_root().iterdir())
    assert len(folders) == 1
    meta = json.loads((folders[0] / "meta.json").read_text())
    assert set(meta["files"]) == {"model.onnx"}
    assert meta["inputs"][:2] == ["input_ids", "attention_mask"]  # + token_type_ids where the tokenizer gives them
    mtime = (folders[0] / "model.onnx").stat().st_mtime_ns

    import medadapt.backends as backends

    def no_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(backends, "_export_onnx", no_export)
    again = medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx")  # from the export folder
    np.testing.assert_array_equal(_enc(again), got)
    assert (folders[0] / "model.onnx").stat().st_mtime_ns == mtime
    assert not [p for p in folders[0].iterdir() if p.name.startswith(".export-")]  # no leftovers


def test_a_damaged_export_is_exported_again(tiny_bert_dir):
    medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx")
    (folder,) = export_root().iterdir()
    data = bytearray((folder / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / "model.onnx").write_bytes(bytes(data))
    with pytest.warns(medadapt.errors.MedAdaptWarning, match="fails its checksum"):
        model = medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx")
    ref = _enc(medadapt.load(str(tiny_bert_dir), device="cpu"))
    np.testing.assert_allclose(_enc(model), ref, atol=1e-4)


def test_int8_is_close_to_torch_but_its_own_model(tiny_bert_dir):
    ref = _enc(medadapt.load(str(tiny_bert_dir), device="cpu"))
    model = medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx-int8")
    got = _enc(model)
    (folder,) = export_root().iterdir()
    assert {"model.onnx", "model.int8.onnx"} <= {p.name for p in folder.iterdir()}
    assert (folder / "model.int8.onnx").stat().st_size < (folder / "model.onnx").stat().st_size
    assert not np.array_equal(got, ref)  # really quantised
    cosine = (got * ref).sum(1)  # both L2-normalised (the model ends with Normalize)
    assert cosine.min() > 0.98, cosine


def test_openvino_equals_torch(tiny_bert_dir):
    pytest.importorskip("openvino")
    ref = _enc(medadapt.load(str(tiny_bert_dir), device="cpu"))
    model = medadapt.load(str(tiny_bert_dir), device="cpu", backend="openvino")
    assert model[0].backend == "openvino"
    np.testing.assert_allclose(_enc(model), ref, atol=1e-4)


def test_heads_work_on_an_onnx_backbone(tiny_bert_dir, tmp_path):
    from medadapt.adapters import save_adapter
    from medadapt.moe import MoEConfig

    model = medadapt.load(str(tiny_bert_dir), device="cpu")
    head = model.add_adapter(MoEConfig.paper(dim=model.get_embedding_dimension(), expansion=2),
                             adapter_name="med")
    torch.manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ref = _enc(model)
    assert not np.allclose(ref, _enc(medadapt.load(str(tiny_bert_dir), device="cpu")), atol=1e-3)  # head acts
    save_adapter(model, tmp_path / "adapter")
    model.save(str(tmp_path / "full"))
    for folder in (tmp_path / "adapter", tmp_path / "full"):
        onnx = medadapt.load(str(folder), device="cpu", backend="onnx")
        assert isinstance(onnx[0].model, BackendModel)
        np.testing.assert_allclose(_enc(onnx), ref, atol=1e-4)
        cached = EmbeddingCache(tmp_path / f"emb-{folder.name}").encode(onnx, TEXTS, show_progress=False)
        np.testing.assert_allclose(cached, ref, atol=1e-4)  # backbone cached, head applied on read


def test_cache_keys_each_backend_apart(tiny_bert_dir, tmp_path):
    cache = EmbeddingCache(tmp_path / "emb")
    torch_model = medadapt.load(str(tiny_bert_dir), device="cpu")
    plain_fp = cache.fingerprint(torch_model)
    models = {b: medadapt.load(str(tiny_bert_dir), device="cpu", backend=b) for b in ("onnx", "onnx-int8")}
    fps = {"torch": plain_fp, **{b: cache.fingerprint(m) for b, m in models.items()}}
    assert len(set(fps.values())) == 3, fps
    assert cache.fingerprint(medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx")) == fps["onnx"]
    names = {cache.namespace(m, "plain", "")[0] for m in [torch_model, *models.values()]}
    assert len(names) == 3

    # a cache filled by one backend is never served for another: each encodes its own texts
    first_int8 = cache.encode(models["onnx-int8"], TEXTS, show_progress=False)
    assert cache.count_missing(models["onnx-int8"], TEXTS) == 0
    assert cache.count_missing(models["onnx"], TEXTS) == len(TEXTS)
    assert cache.count_missing(torch_model, TEXTS) == len(TEXTS)
    got = cache.encode(models["onnx"], TEXTS, show_progress=False)
    np.testing.assert_allclose(got, _enc(torch_model), atol=1e-4)
    assert not np.allclose(got, first_int8, atol=1e-6)
    # int8 activations are quantised per batch, so its own cache (not a re-encode) gives back the same rows
    np.testing.assert_array_equal(cache.encode(models["onnx-int8"], TEXTS, show_progress=False), first_int8)


def test_unknown_backend_is_one_clear_error(tiny_bert_dir):
    for bad in ("tensorrt", "ONNX", "int8", ""):
        with pytest.raises(MedAdaptError) as err:
            medadapt.load(str(tiny_bert_dir), device="cpu", backend=bad)
        assert str(err.value) == f"unknown backend {bad!r} (valid: torch, onnx, onnx-int8, openvino)"
    assert list(BACKENDS) == ["torch", "onnx", "onnx-int8", "openvino"]


@pytest.mark.parametrize(("backend", "missing", "extra"), [("onnx", "onnxruntime", "onnx"),
                                                          ("onnx-int8", "onnxruntime", "onnx"),
                                                          ("openvino", "openvino", "openvino")])
def test_missing_package_says_what_to_install(tiny_bert_dir, monkeypatch, backend, missing, extra):
    monkeypatch.setitem(sys.modules, missing, None)  # import raises ImportError, as when not installed
    with pytest.raises(MedAdaptError) as err:
        medadapt.load(str(tiny_bert_dir), device="cpu", backend=backend)
    assert f"'{missing}' package" in str(err.value) and f"pip install 'medadapt[{extra}]'" in str(err.value)
    assert not export_root().exists()  # refused before anything was loaded or exported


def test_a_model_on_another_backend_refuses_to_save(tiny_bert_dir, tmp_path):
    model = medadapt.load(str(tiny_bert_dir), device="cpu", backend="onnx")
    with pytest.raises(MedAdaptError, match="backend='torch' to save"):
        model.save(str(tmp_path / "out"))


def test_cli_backend_option(tiny_bert_dir, tiny_beir_dir, tmp_path, monkeypatch):
    from medadapt.cli import app

    runner = CliRunner()
    outs = {}
    for backend in ("torch", "onnx"):
        out = tmp_path / f"{backend}.json"
        res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir),
                                  "--backend", backend, "--output", str(out), "-q"])
        assert res.exit_code == 0, res.output
        outs[backend] = json.loads(out.read_text())
    assert outs["onnx"]["ndcg@10"] == pytest.approx(outs["torch"]["ndcg@10"], abs=1e-6)
    res = runner.invoke(app, ["eval", "--model", str(tiny_bert_dir), "--data", str(tiny_beir_dir),
                              "--backend", "nope", "-q"])
    assert res.exit_code == 1
    assert res.output.strip() == "error: unknown backend 'nope' (valid: torch, onnx, onnx-int8, openvino)"

    index = tmp_path / "index"
    res = runner.invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(index), "--model",
                              str(tiny_bert_dir), "--backend", "onnx", "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["search", "--index", str(index), "--backend", "onnx", "gout toe"])
    assert res.exit_code == 0, res.output
    assert "gout" in res.output
    res = runner.invoke(app, ["search", "--index", str(index), "gout toe"])  # torch: another fingerprint
    assert res.exit_code == 1 and "fingerprint" in res.output
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    res = runner.invoke(app, ["index", "--corpus", str(tiny_beir_dir), "--out", str(tmp_path / "i2"), "--model",
                              str(tiny_bert_dir), "--backend", "onnx", "-q"])
    assert res.exit_code == 1 and "pip install 'medadapt[onnx]'" in res.output
    assert not (tmp_path / "i2").exists()
