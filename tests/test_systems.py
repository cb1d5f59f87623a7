"""One battery over the four systems' tiny CPU-twin recipes (``recipes/*-tiny.yaml``) on tiny random models:

* train -> save -> load gives the encodings of the model in memory, bit for bit (dense and learned sparse);
* a run killed mid-training and run again resumes from its checkpoints and ends with the same model as an
  uninterrupted run (every system trains on the one loop);
* the saved folder is one of a medadapt run (recipe.yaml, train_log.json) with checkpoints beside it;
* 2 CPU processes under ``accelerate launch`` train like one process (same loss curve, same model).

The composed models (medadapt.adapters.compose: a MoE head plus HyReC's lexical branch, a MoE head on the
query route of an asymmetric model) go through the save/load battery, the hybrid one through resume too.
Med-MoE-Embed's backbone / LoRA path (``moe-lora``: LoRA plus a MoE head; ``moe-backbone``: every backbone
weight) goes through save/load, resume and 2 processes (LoRA) or resume (backbone).

"Beats the untrained model" is per system, with settings that make each system learn on tiny data
(tests/test_train_recipe.py, test_care_recipe.py, test_hyrec_recipe.py, test_bmretriever.py), and so are
the systems' own distributed details (routing counters, resuming a 2-process checkpoint in one process:
tests/test_distributed.py, test_hyrec_distributed.py, test_bmretriever_distributed.py).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _helpers import tiny_system_recipe as _setup

from medadapt.tiny import build_tiny_qwen2

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TEXTS = ["symptoms of gout", "asthma is a condition with wheezing inhaler airway breath cough."]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory) -> Path:
    return build_tiny_qwen2(tmp_path_factory.mktemp("qwen"))


def _encodings(encoder) -> dict[str, np.ndarray]:
    out = {}
    if hasattr(encoder, "encode_query"):
        out["query"] = np.asarray(encoder.encode_query(TEXTS))
        out["document"] = np.asarray(encoder.encode_document(TEXTS))
    if hasattr(encoder, "encode_lexical"):
        for role in ("query", "document"):
            vectors = encoder.encode_lexical(TEXTS, role)  # [{term id: weight}]
            out[f"lexical-{role}"] = np.array([sorted(v.items()) for v in vectors], dtype=object)
    return out


def _run(kind, bert, qwen, beir, out, extra=(), **kw):
    from medadapt.recipes import run_recipe

    recipe, overrides = _setup(kind, bert, qwen, beir)
    return run_recipe(recipe, out, [*overrides, *extra], show_progress=False, log=lambda _m: None, **kw)


@pytest.mark.parametrize("kind", ["moe", "hyrec", "care", "bmretriever", "moe-hybrid", "moe-care-query",
                                  "moe-lora"])
def test_train_save_load_gives_identical_encodings(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path):
    from medadapt.retrieval.encoders import as_encoder, open_encoder

    res = _run(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path / "run", evaluate=False)
    assert res.loss_history and (tmp_path / "run" / "recipe.yaml").is_file()
    assert (tmp_path / "run" / "train_log.json").is_file() and not (tmp_path / "run" / "checkpoints").exists()
    assert (tmp_path / "run.checkpoints").is_dir()
    res.model.eval()
    before = _encodings(as_encoder(res.model))
    after = _encodings(open_encoder(str(tmp_path / "run"), device="cpu"))
    assert set(before) == set(after) and "query" in before
    for key in before:
        assert before[key].tolist() == after[key].tolist(), f"{kind}: {key} changed on reload"


@pytest.mark.parametrize("kind", ["moe", "hyrec", "care", "bmretriever", "moe-hybrid", "moe-lora",
                                  "moe-backbone"])
def test_killed_run_resumes_to_the_uninterrupted_model(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path,
                                                       monkeypatch):
    import medadapt.training.loop as loop
    from medadapt.retrieval.encoders import open_encoder

    every = ["training.checkpoint_every_steps=1"]
    whole = _run(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path / "whole", every, evaluate=False)
    n_steps = len(whole.loss_history)
    assert n_steps >= 4

    real, calls = loop._one_step, [0]

    def dies_midway(*args, **kwargs):
        calls[0] += 1
        if calls[0] > n_steps // 2:
            raise KeyboardInterrupt  # what a kill leaves: checkpoints up to the last finished step
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "_one_step", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        _run(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path / "killed", every, evaluate=False)
    assert not (tmp_path / "killed").exists()  # nothing half-saved
    monkeypatch.setattr(loop, "_one_step", real)
    resumed = _run(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path / "killed", every, evaluate=False)
    assert [r["loss"] for r in resumed.loss_history] == [r["loss"] for r in whole.loss_history]
    a = _encodings(open_encoder(str(tmp_path / "whole"), device="cpu"))
    b = _encodings(open_encoder(str(tmp_path / "killed"), device="cpu"))
    for key in a:
        assert a[key].tolist() == b[key].tolist(), f"{kind}: {key} differs after resume"


@pytest.mark.parametrize("kind", ["moe", "hyrec", "care", "bmretriever", "moe-lora"])
def test_two_processes_train_like_one(kind, tiny_bert_dir, qwen_dir, tiny_beir_dir, tmp_path):
    from medadapt.retrieval.encoders import open_encoder

    bert = tmp_path / "bert"  # without dropout: each process would draw its own masks
    shutil.copytree(tiny_bert_dir, bert)
    config = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({k: 0.0 if k.endswith("dropout_prob") else v
                                                  for k, v in config.items()}))
    recipe, overrides = _setup(kind, bert, qwen_dir, tiny_beir_dir)
    overrides.append("training.device=cpu")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(RECIPES / "accelerate" / "cpu-2proc.yaml"), "--main_process_port", str(port), "-m", "medadapt",
           "train", str(recipe), "--output", str(tmp_path / "two"), "--no-eval", "-q"]
    for o in overrides:
        cmd += ["--set", o]
    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cache2"), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        from medadapt.recipes import run_recipe

        one = run_recipe(recipe, tmp_path / "one", overrides, evaluate=False, show_progress=False,
                         log=lambda _m: None)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    two = json.loads((tmp_path / "two" / "train_log.json").read_text())
    assert two["num_processes"] == 2
    assert [r["loss"] for r in two["loss_history"]] == pytest.approx([r["loss"] for r in one.loss_history],
                                                                      abs=1e-4)
    a = _encodings(open_encoder(str(tmp_path / "one"), device="cpu"))
    b = _encodings(open_encoder(str(tmp_path / "two"), device="cpu"))
    for key in a:
        if key.startswith("lexical"):  # term ids must agree; weights within float rounding
            assert [[t for t, _ in v] for v in a[key].tolist()] == [[t for t, _ in v] for v in b[key].tolist()]
        else:
            np.testing.assert_allclose(a[key], b[key], atol=1e-4, err_msg=f"{kind}: {key}")
