"""HyReC under ``accelerate launch``: 2 CPU processes (gloo) train ``recipes/hyrec-tiny.yaml`` exactly like
one process with the same global batch and seed (sharded batches, in-batch negatives gathered across
processes, gradients averaged), and the main process's checkpoints resume in one process onto the same
curve.

Launched like tests/test_distributed.py: ``accelerate launch --config_file recipes/accelerate/cpu-2proc.yaml``
(the torchrun launcher; ``accelerate launch --cpu --num_processes 2`` needs mpirun) with
``training.device=cpu``. Dropout is switched off in the tiny BERT (each process draws its own masks).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "recipes" / "hyrec-tiny.yaml"
CPU_2PROC = ROOT / "recipes" / "accelerate" / "cpu-2proc.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_the_hyrec_recipe_like_one(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.hyrec.model import HyReCModel
    from medadapt.hyrec.sections import HyReCRecipe
    from medadapt.recipes import load_recipe, run_recipe

    bert = tmp_path / "bert"
    shutil.copytree(tiny_bert_dir, bert)
    config = json.loads((bert / "config.json").read_text())
    config.update({k: 0.0 for k in config if k.endswith("dropout_prob")})
    (bert / "config.json").write_text(json.dumps(config))
    overrides = [f"model.backbone={bert}", f"data.path={tiny_beir_dir}", "training.device=cpu",
                 "training.batch_size=5",  # 12 examples: global batches 5, 5, 2 -> uneven shards 3/2 and 1/1
                 "training.epochs=2", "training.lr=1e-3", "training.checkpoint_every_steps=4",
                 "negatives.source=dense", "negatives.num=2", "negatives.window=[1, 6]",
                 f"negatives.miner={bert}"]  # mined by the tiny model: its corpus encode is shared
    two_dir = tmp_path / "two"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC),
           "--main_process_port", str(_free_port()), "-m", "medadapt", "train", str(TINY),
           "--output", str(two_dir), "--no-eval", "-q"]
    for o in overrides:
        cmd += ["--set", o]
    env = {**os.environ, "MEDADAPT_CACHE": str(tmp_path / "cache2"), "HF_HUB_OFFLINE": "1",
           "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    recipe = load_recipe(TINY, overrides, expect=HyReCRecipe)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = run_recipe(recipe, tmp_path / "one", evaluate=False, show_progress=False, log=lambda m: None)
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail(f"accelerate launch timed out:\n{out[-3000:]}")
        assert proc.returncode == 0, out[-5000:]

        two = json.loads((two_dir / "train_log.json").read_text())
        assert two["num_processes"] == 2 and two["train_examples"] == one.details["train_examples"] == 12
        (shared,) = two["shared_encoding"]
        assert shared["cached_before"] == 0 and min(shared["per_process"]) > 0
        assert sum(shared["per_process"]) == shared["unique"] and "shared_encoding" not in one.details
        assert len(one.loss_history) == len(two["loss_history"]) == 6
        for a, b in zip(one.loss_history, two["loss_history"]):
            assert a["step"] == b["step"]
            for key in ("loss", "lexical", "dense", "union", "lr"):
                assert b[key] == pytest.approx(a[key], abs=1e-5), (key, a, b)
        m1, m2 = HyReCModel.load(tmp_path / "one"), HyReCModel.load(two_dir)
        for (name, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
            torch.testing.assert_close(p2, p1, atol=1e-4, rtol=1e-3, msg=name)
        fresh = dict(HyReCModel.from_backbone(str(bert), m1.config).named_parameters())
        assert any(not torch.equal(p, fresh[n]) for n, p in m1.named_parameters() if n.startswith("st.0."))  # trained

        # the main process wrote the checkpoints beside the model folder; one of them resumes in one process
        ckpts = sorted(p.name for p in (tmp_path / "two.checkpoints").iterdir())
        assert ckpts == ["step-00000004", "step-00000006"]
        (tmp_path / "resumed.checkpoints").mkdir()
        shutil.copytree(tmp_path / "two.checkpoints" / "step-00000004",
                        tmp_path / "resumed.checkpoints" / "step-00000004")
        resumed = run_recipe(recipe, tmp_path / "resumed", evaluate=False, show_progress=False, log=lambda m: None)
        for a, b in zip(one.loss_history, resumed.loss_history):
            assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert len(resumed.loss_history) == 6
    finally:
        torch.set_num_threads(threads)
