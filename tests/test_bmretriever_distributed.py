"""The issue's CI check: ``medadapt train`` on 2 CPU processes (DDP over gloo) matches 1 process.

Same recipe (``recipes/bmretriever-tiny.yaml``: tiny random Qwen2 decoder, LoRA, dropout off), same seed, same
*global* batch (the one loop shards each batch over processes and gathers the in-batch negatives across them),
so both stages' loss curves must agree within floating-point noise.

Launch line: ``accelerate launch --multi_gpu --num_processes 2 -m medadapt train ...`` with the recipe's
``training.device: cpu``. (``accelerate launch --cpu --num_processes 2`` starts multi-CPU jobs only through
``mpirun``; the ``--multi_gpu`` launcher is torchrun, and ``device: cpu`` makes every rank a CPU/gloo rank, so
this runs on machines with or without GPUs.) The launch starts first; the one-process run goes through the CLI's
entry point in this process meanwhile (``conftest.run_cli``: no third interpreter importing torch); ~30-60 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TOPICS, build_tiny_bert, run_cli, write_beir
from medadapt.tiny import build_tiny_qwen2

pytestmark = pytest.mark.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parents[1]


def _beir(root: Path) -> Path:
    corpus, queries, test, train = {}, {}, {}, {}
    for i, (name, words) in enumerate(TOPICS):
        corpus[f"d{i}"] = (name, f"{name} is a condition with {words}.")
        queries[f"t{i}"] = f"treatment {name} {words.split()[0]}"
        queries[f"q{i}"] = f"symptoms of {name}"
        train[f"t{i}"] = {f"d{i}": 1}
        test[f"q{i}"] = {f"d{i}": 1}
    return write_beir(root, corpus, queries, {"train": train, "test": test})


def test_two_processes_match_one_process(tmp_path):
    decoder = build_tiny_qwen2(tmp_path / "dec", padding_side="right")
    bert = build_tiny_bert(tmp_path / "bert")
    beir = _beir(tmp_path / "beir")
    common = ["train", str(ROOT / "recipes" / "bmretriever-tiny.yaml"), "--no-eval", "-q",
              "--set", f"model.name={decoder}", "--set", f"data.path={beir}",
              "--set", f"stage2.base_retriever={bert}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
              "--main_process_port", "29517", "-m", "medadapt"]
    runs = ("one", "two")
    with open(tmp_path / "two.log", "w") as log:  # a file, not a pipe: nobody reads it while `one` runs
        two = subprocess.Popen(launch + common + ["--output", str(tmp_path / "two"), "--cache-dir",
                                                  str(tmp_path / "c2")],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        one = run_cli(common + ["--output", str(tmp_path / "one"), "--cache-dir", str(tmp_path / "c1")], env,
                      tmp_path)
        two.wait(timeout=300)
    assert one.returncode == 0, f"one-process run failed:\n{(one.stdout + one.stderr)[-4000:]}"
    assert two.returncode == 0, f"two-process run failed:\n{(tmp_path / 'two.log').read_text()[-4000:]}"
    logs = {k: json.loads((tmp_path / k / "train_log.json").read_text()) for k in runs}
    assert logs["one"]["num_processes"] == 1 and logs["two"]["num_processes"] == 2
    for stage in ("stage1", "stage2"):
        one = [r["loss"] for r in logs["one"]["stages"][stage]["loss_history"]]
        two = [r["loss"] for r in logs["two"]["stages"][stage]["loss_history"]]
        assert len(one) == len(two) == 3  # 12 rows, global batch 4, logged every step
        assert two == pytest.approx(one, abs=1e-4, rel=0), stage  # measured: <= 3e-6
    assert logs["one"]["stages"]["stage2"]["rows"] == logs["two"]["stages"]["stage2"]["rows"] == 12
    (shared,) = logs["two"]["shared_encoding"]  # the mining corpus encode, shared by both processes
    assert shared["cached_before"] == 0 and min(shared["per_process"]) > 0
    assert sum(shared["per_process"]) == shared["unique"] and "shared_encoding" not in logs["one"]
    # the run's rows (what `medadapt train` reports): same stages, steps and learning rates
    rows = {k: [(r["stage"], r["step"], r["lr"]) for r in logs[k]["loss_history"]] for k in runs}
    assert rows["one"] == rows["two"] and len(rows["one"]) == 6
