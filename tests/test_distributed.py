"""Distributed training of medadapt's own loops (the MoE head schedule, CARE stages).

(a) the gather / sharding helpers of :mod:`medadapt.training.distributed` in one process;
(b) ``accelerate launch`` with 2 CPU processes (gloo) of ``recipes/med-moe-embed-tiny.yaml`` gives the loss
    curve of the one-process run with the same global batch and seed, and its checkpoints resume in one
    process onto the same curve;
(c) the same for ``recipes/care-tiny.yaml`` (every CARE phase; marked slow).

``accelerate launch --cpu --num_processes 2`` starts a single process (Accelerate's CPU launcher needs
mpirun for more), so the launches use ``recipes/accelerate/cpu-2proc.yaml`` (torchrun launcher) with
``training.device=cpu``: the runners then pick gloo on the CPU.
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

from medadapt.training.distributed import (
    average_gradients,
    broadcast_parameters,
    gather_with_grad,
    is_distributed,
    shard_bounds,
)

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"
CPU_2PROC = RECIPES / "accelerate" / "cpu-2proc.yaml"


# ----------------------------------------------------------------------------------------- (a) helpers
def test_shards_are_contiguous_balanced_and_cover_the_batch_in_order():
    assert [shard_bounds(10, r, 4) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [shard_bounds(0, r, 3) for r in range(3)] == [(0, 0)] * 3
    for n in range(0, 13):
        for world in (1, 2, 3, 5):
            bounds = [shard_bounds(n, r, world) for r in range(world)]
            items = [i for lo, hi in bounds for i in range(lo, hi)]
            assert items == list(range(n))
            assert max(hi - lo for lo, hi in bounds) - min(hi - lo for lo, hi in bounds) <= 1
    with pytest.raises(ValueError, match="rank"):
        shard_bounds(4, 2, 2)
    with pytest.raises(ValueError):
        shard_bounds(-1, 0, 1)


def test_single_process_helpers_are_identity_and_keep_gradients():
    assert not is_distributed()
    x = torch.randn(5, 3, requires_grad=True)
    gathered = gather_with_grad(x)
    assert gathered is x
    (gathered * torch.arange(3.0)).sum().backward()
    torch.testing.assert_close(x.grad, torch.arange(3.0).expand(5, 3))
    mask = torch.tensor([True, False])
    assert torch.equal(gather_with_grad(mask), mask)

    layer = torch.nn.Linear(3, 2)
    layer(x.detach()).sum().backward()
    before = layer.weight.grad.clone()
    average_gradients(layer.parameters())  # no process group: untouched
    broadcast_parameters(layer.parameters())
    torch.testing.assert_close(layer.weight.grad, before)


def test_gathered_infonce_equals_the_full_batch_loss_in_one_process():
    """What each process computes under N processes (shards mapped separately, then concatenated in rank
    order) is the single-process InfoNCE of the global batch, gradients included."""
    from medadapt.losses import InfoNCELoss

    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    q, p, n = torch.randn(7, 8), torch.randn(7, 8), torch.randn(7, 2, 8)
    loss = InfoNCELoss(0.05)
    full = loss(layer(q), layer(p), layer(n))["infonce"]
    full_grad = torch.autograd.grad(full, layer.weight)[0]
    pieces = [shard_bounds(7, r, 3) for r in range(3)]
    sharded = loss(torch.cat([layer(q[a:b]) for a, b in pieces]), torch.cat([layer(p[a:b]) for a, b in pieces]),
                   torch.cat([layer(n[a:b]) for a, b in pieces]))["infonce"]
    torch.testing.assert_close(sharded, full)
    torch.testing.assert_close(torch.autograd.grad(sharded, layer.weight)[0], full_grad)


# --------------------------------------------------------------------------------- (b) and (c): launches
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(recipe: Path, output: Path, overrides: list[str], cache: Path) -> subprocess.Popen:
    """Start ``accelerate launch`` of ``medadapt train`` on 2 CPU processes (returns at once)."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC),
           "--main_process_port", str(_free_port()), "-m", "medadapt", "train", str(recipe),
           "--output", str(output), "--no-eval", "-q"]
    for o in overrides:
        cmd += ["--set", o]
    env = {**os.environ, "MEDADAPT_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "",
           "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"accelerate launch timed out:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-5000:]
    return out


def _losses(history: list[dict]) -> list[tuple[float, float]]:
    return [(row["step"], row["loss"]) for row in history]


def _assert_same_curve(one: list[dict], two: list[dict]) -> None:
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        for key in ("loss", "infonce", "load_balance", "asym_infonce", "mse", "lr"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (key, a, b)


HEAD_OVERRIDES = [
    "training.device=cpu",
    "data.hard_negatives.window=[2, 6]",
    "training.batch_size=5",  # 12 pairs: global batches 5, 5, 2 -> uneven shards 3/2 and 1/1
    "training.shared_epochs=2",
    "training.random_routing_epochs=1",  # one seeded global draw per step: the same routing on 1 or 2 processes
    "training.epochs=2",
    "training.checkpoint_every_steps=4",
]


def test_two_processes_train_the_head_recipe_like_one(tiny_bert_dir, tiny_beir_dir, tmp_path):
    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import load_recipe, run_recipe

    recipe_file = RECIPES / "med-moe-embed-tiny.yaml"
    overrides = [f"model.backbone={tiny_bert_dir}", f"data.path={tiny_beir_dir}", *HEAD_OVERRIDES]
    cache = tmp_path / "cache"
    two_dir, one_dir = tmp_path / "two", tmp_path / "one"
    proc = _launch(recipe_file, two_dir, overrides, cache)
    one = run_recipe(load_recipe(recipe_file, overrides), one_dir, cache=EmbeddingCache(tmp_path / "cache1"),
                     show_progress=False, evaluate=False, log=lambda m: None)
    out = _finish(proc)
    assert out.count("-parameter head on 12 pairs") == 1, out  # only the main process logs

    two = json.loads((two_dir / "train_log.json").read_text())
    # the corpus encode was shared: each process encoded a part of the (empty) cache's misses
    (shared,) = two["shared_encoding"]
    assert shared["role"] == "document" and shared["cached_before"] == 0 and "shared_encoding" not in one.details
    assert sum(shared["per_process"]) == shared["unique"] and min(shared["per_process"]) > 0, shared
    assert len(one.loss_history) == 5 * 3 and one.loss_history[0]["load_balance"] == 0.0
    _assert_same_curve(one.loss_history, two["loss_history"])
    stats = two["routing_stats"]  # counters summed over both processes = the one-process counters
    assert stats["running_counts"] == one.details["routing_stats"]["running_counts"]
    assert stats["inputs_seen"] == one.details["routing_stats"]["inputs_seen"] == 2 * 12 * 4  # learned stage

    # the main process wrote complete checkpoints (beside the model folder); resuming one of them in a
    # single process continues the same curve
    checkpoints = sorted(p.name for p in (tmp_path / "two.checkpoints").iterdir())
    assert checkpoints == ["step-00000012", "step-00000015"]
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "two.checkpoints" / "step-00000012",
                    tmp_path / "resumed.checkpoints" / "step-00000012")
    resumed = run_recipe(load_recipe(recipe_file, overrides), resumed_dir,
                         cache=EmbeddingCache(tmp_path / "cache1"), show_progress=False, evaluate=False,
                         log=lambda m: None)
    _assert_same_curve(one.loss_history, resumed.loss_history)


@pytest.mark.slow
def test_two_processes_train_the_care_recipe_like_one(tiny_bert_dir, tiny_qwen2_dir, tiny_beir_dir, tmp_path):
    """Every CARE phase (init of both towers with MRL, stage I against cached teacher embeddings, stage II
    with LoRA on the document route) under 2 processes follows the one-process curves."""

    from medadapt.cache import EmbeddingCache
    from medadapt.recipes import run_recipe

    # dropout draws differ per process (like random routing); switch it off to compare curves exactly
    bert = tmp_path / "bert"
    shutil.copytree(tiny_bert_dir, bert)
    config = json.loads((bert / "config.json").read_text())
    config.update({k: 0.0 for k in config if k.endswith("dropout_prob")})
    (bert / "config.json").write_text(json.dumps(config))
    qwen = tiny_qwen2_dir
    recipe_file = RECIPES / "care-tiny.yaml"
    overrides = [f"document.model={qwen}", f"query.model={bert}", f"data.path={tiny_beir_dir}",
                 "training.device=cpu", "stage1.batch_size=7"]  # uneven shards 4/3
    two_dir = tmp_path / "two"
    proc = _launch(recipe_file, two_dir, overrides, tmp_path / "cache")
    one = run_recipe(recipe_file, tmp_path / "one", overrides, cache=EmbeddingCache(tmp_path / "cache1"),
                     show_progress=False, evaluate=False, log=lambda m: None)
    _finish(proc)
    two = json.loads((two_dir / "train_log.json").read_text())
    shared = two["shared_encoding"]  # mining encodes of the corpus, shared by both processes
    assert all(sum(e["per_process"]) + e["cached_before"] == e["unique"] for e in shared), shared
    assert any(min(e["per_process"]) > 0 for e in shared), shared
    stages = one.details["stages"]
    assert set(two["stages"]) == set(stages) == {"init_document", "init_query", "stage1", "stage2"}
    for name, summary in stages.items():
        assert two["stages"][name]["steps"] == summary["steps"]
        for key in ("first_loss", "last_loss"):
            assert two["stages"][name][key] == pytest.approx(summary[key], rel=1e-4, abs=1e-5), name
    _assert_same_curve(one.loss_history, two["loss_history"])


# ---------------------------------------------------------------- (d) a parameter the loss reads directly
class _EncoderWithTemperature(torch.nn.Module):
    """An encoder and a learnable-temperature InfoNCE (CARE's unsupervised phase in small): the loss
    module is called on the outputs gathered from every process, after the model's forward."""

    def __init__(self) -> None:
        from medadapt.losses import LearnableTemperatureInfoNCELoss

        super().__init__()
        self.encoder = torch.nn.Linear(8, 8)
        self.temperature = LearnableTemperatureInfoNCELoss(0.1)

    def forward(self, x):
        return self.encoder(x)


class _TemperatureStep:
    def __init__(self, model, q, d) -> None:
        self.model, self.q, self.d = model, q, d

    def forward(self, run_model, batch):
        return {"q": run_model(self.q[batch.indices]), "d": run_model(self.d[batch.indices])}

    def loss(self, out, batch):
        return self.model.temperature(out["q"], out["d"])


def _temperature_run(accelerator, accumulation: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each step's averaged gradients (encoder weight, log temperature) as the optimiser sees them."""
    from medadapt.training.config import OptimSection
    from medadapt.training.loop import Stage, train

    torch.manual_seed(1)
    model = _EncoderWithTemperature()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(32, 8, generator=g)
    d = q + 0.3 * torch.randn(32, 8, generator=g)
    grads = []

    def progress(stage, step, total, row):  # after the optimiser step, before the next zero_grad
        grads.append((model.encoder.weight.grad.clone(), model.temperature.log_temperature.grad.clone()))

    optim = OptimSection(batch_size=8 // accumulation, gradient_accumulation_steps=accumulation, lr=1e-2, epochs=1,
                         warmup_ratio=0.0, max_grad_norm=None)
    train(model, [Stage("a", 32, _TemperatureStep(model, q, d), list(model.parameters()), optim)], seed=3,
          accelerator=accelerator, progress=progress)
    return grads


def _temperature_worker(rank: int, root: str) -> None:
    import torch.distributed as dist

    from conftest import CpuAccelerator

    dist.init_process_group("gloo", init_method=f"file://{root}/store", rank=rank, world_size=2)
    try:
        runs = {k: _temperature_run(CpuAccelerator(rank, 2), k) for k in (1, 2)}
        if rank == 0:
            torch.save(runs, f"{root}/grads.pt")
    finally:
        dist.destroy_process_group()


def test_two_processes_give_a_learnable_temperature_the_gradient_of_one(tmp_path):
    """A loss computed on the gathered global batch is the same on every process. Back-propagating ``N x
    loss`` (each process reaches only its own slice of the outputs) gave the encoder the right average, but
    a parameter the loss reads directly got ``N`` times its gradient: 2x the temperature's here, which
    clipping then traded against the encoder's. The local slice's gradient is scaled instead. With and
    without GradCache accumulation, two processes now give every gradient of one."""
    import torch.multiprocessing as mp

    one = {k: _temperature_run(None, k) for k in (1, 2)}
    mp.spawn(_temperature_worker, args=(str(tmp_path),), nprocs=2, join=True)
    two = torch.load(tmp_path / "grads.pt", weights_only=True)
    for k in (1, 2):
        assert len(two[k]) == len(one[k]) == 4
        for (w1, t1), (w2, t2) in zip(one[k], two[k]):
            torch.testing.assert_close(w2, w1, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(t2, t1, atol=1e-6, rtol=1e-5)
