"""The one training loop (medadapt.training.loop): accumulation equals the large batch, resume equals an
uninterrupted run, a non-finite loss stops training, schedules shared across stages."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from _helpers import PairStep, StopRun, linear_model, loop_run, pair_data
from medadapt.errors import ConfigError
from medadapt.training.checkpoint import CheckpointConfig
from medadapt.training.config import OptimSection
from medadapt.training.loop import Stage, TrainingError, train


def _kill_at(at: int):
    """A ``progress`` callback that kills the run after its step ``at``."""
    def kill(stage, step, total, row):
        if step == at:
            raise StopRun
    return kill


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_accumulation_of_k_steps_at_b_equals_one_step_at_kb(dropout):
    big, res_big = loop_run(OptimSection(batch_size=16, lr=1e-2, epochs=2, warmup_ratio=0.0), dropout=dropout)
    acc, res_acc = loop_run(OptimSection(batch_size=4, gradient_accumulation_steps=4, lr=1e-2, epochs=2,
                                        warmup_ratio=0.0), dropout=dropout)
    assert res_big.steps == res_acc.steps == 4
    assert [r["loss"] for r in res_acc.loss_history] == pytest.approx([r["loss"] for r in res_big.loss_history],
                                                                       abs=1e-5)
    if dropout == 0.0:  # with dropout the chunks draw other masks than one large batch; both are valid runs
        for a, b in zip(big.parameters(), acc.parameters()):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_plain_accumulation_would_differ():
    """The equality above is not trivial: the loss at batch 4 differs from the loss at batch 16."""
    _, small = loop_run(OptimSection(batch_size=4, lr=1e-2, epochs=1, warmup_ratio=0.0))
    _, big = loop_run(OptimSection(batch_size=16, lr=1e-2, epochs=1, warmup_ratio=0.0))
    assert small.loss_history[0]["loss"] != pytest.approx(big.loss_history[0]["loss"], abs=1e-3)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_gradients_reach_the_optimiser_clipped_to_max_grad_norm(accumulation):
    """Every optimiser step sees a gradient of norm <= ``max_grad_norm`` (with GradCache too); without
    clipping the same run's norms are larger, so the bound is not met by chance."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    norms: dict[float | None, list[float]] = {}
    for clip in (0.05, None):
        seen = norms[clip] = []

        def record(optimizer, args, kwargs, seen=seen):
            grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            seen.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads]))))

        handle = register_optimizer_step_pre_hook(record)
        try:
            loop_run(OptimSection(batch_size=8 // accumulation, gradient_accumulation_steps=accumulation, lr=1e-2,
                                 epochs=1, warmup_ratio=0.0, max_grad_norm=clip))
        finally:
            handle.remove()
    assert len(norms[0.05]) == len(norms[None]) == 4
    assert max(norms[0.05]) <= 0.05 * (1 + 1e-4)
    assert min(norms[None]) > 0.1


def test_training_lowers_the_loss():
    _, res = loop_run(OptimSection(batch_size=8, lr=5e-2, epochs=10, warmup_ratio=0.0))
    first = sum(r["loss"] for r in res.loss_history[:4]) / 4
    last = sum(r["loss"] for r in res.loss_history[-4:]) / 4
    assert last < 0.8 * first


def test_resume_equals_uninterrupted(tmp_path):
    optim = OptimSection(batch_size=8, lr=1e-2, epochs=3, warmup_ratio=0.1)
    whole, res_whole = loop_run(optim, dropout=0.1)

    kill = _kill_at(5)

    ckpt = CheckpointConfig(tmp_path / "ck", every_steps=2)
    with pytest.raises(StopRun):
        loop_run(optim, dropout=0.1, checkpoint=ckpt, fingerprint="run-a", progress=kill)
    resumed, res = loop_run(optim, dropout=0.1, checkpoint=ckpt, fingerprint="run-a")
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in res_whole.loss_history]


def test_resume_of_another_run_is_refused(tmp_path):
    optim = OptimSection(batch_size=8, lr=1e-2, epochs=1)
    ckpt = CheckpointConfig(tmp_path / "ck")
    loop_run(optim, checkpoint=ckpt, fingerprint="run-a")
    with pytest.raises(TrainingError, match="another run"):
        loop_run(optim, checkpoint=ckpt, fingerprint="run-b")


def test_non_finite_loss_stops_before_the_step(tmp_path):
    q, d = pair_data()
    q[5] = float("nan")
    model = linear_model()
    before = [p.detach().clone() for p in model.parameters()]
    ckpt = CheckpointConfig(tmp_path / "ck")
    with pytest.raises(TrainingError, match="not finite"):
        train(model, [Stage("main", len(q), PairStep(q, d), list(model.parameters()),
                            OptimSection(batch_size=32))], checkpoint=ckpt)
    for a, b in zip(before, model.parameters()):
        assert torch.equal(a, b)
    assert not (tmp_path / "ck").exists() or not any((tmp_path / "ck").glob("step-*"))


def test_stages_sharing_a_schedule_share_the_learning_rate_curve():
    q, d = pair_data()
    model = linear_model()
    optim = OptimSection(batch_size=8, lr=1e-2, epochs=1, warmup_ratio=0.0, scheduler="linear")
    stages = [Stage(n, len(q), PairStep(q, d), list(model.parameters()), optim, schedule="s") for n in ("a", "b")]
    res = train(model, stages)
    lrs = [r["lr"] for r in res.loss_history]
    assert len(lrs) == 8 and lrs[0] == pytest.approx(1e-2)
    assert lrs[4] == pytest.approx(1e-2 * 4 / 8)  # one linear decay over both stages, not two
    assert res.stage_steps == {"a": 4, "b": 4}


class _FakeDeepSpeed:
    """What ``train`` reads of an Accelerator launched with a DeepSpeed config, before it prepares anything."""

    process_index, num_processes, device = 0, 1, torch.device("cpu")

    class state:  # noqa: N801 - mirrors accelerator.state
        deepspeed_plugin = object()


def test_deepspeed_refuses_separate_optimizers_and_untrained_parameters_before_any_step():
    """On an H100, ZeRO-2 failed inside its gradient reduction (IndexError) when Med-MoE-Embed's stages
    trained parts of the head with two optimizers: the loop now refuses such runs up front, naming why."""
    q, d = pair_data()
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    first, second = list(model[0].parameters()), list(model[1].parameters())
    step = PairStep(q, d)
    optim = OptimSection(batch_size=8, epochs=1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=r"one optimizer, but this run trains with 2 separate optimizers "
                                          r"\(stages: a; b\).*multi-gpu.yaml"):
        train(model, [Stage("a", 32, step, first, optim), Stage("b", 32, step, second, optim)],
              accelerator=_FakeDeepSpeed())
    with pytest.raises(ConfigError, match=r"2 are not trained by any stage \(1.weight, 1.bias"):
        train(model, [Stage("a", 32, step, first, optim)], accelerator=_FakeDeepSpeed())
    accumulating = OptimSection(batch_size=4, gradient_accumulation_steps=2, epochs=1)
    with pytest.raises(ConfigError, match=r"gradient_accumulation_steps > 1 \(stages: a\) is not supported under "
                                          r"DeepSpeed.*fsdp.yaml"):
        train(model, [Stage("a", 32, step, first + second, accumulating)], accelerator=_FakeDeepSpeed())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # nothing moved


def test_a_finished_schedule_frees_its_optimizer_state_and_gradients_and_resume_is_unchanged(tmp_path):
    """Two stages with separate optimizers: when the first ends, its AdamW state and gradients go (they
    stayed on the GPU for the rest of the run before), and a run killed in the second stage resumes to the
    uninterrupted model."""
    from medadapt.training.checkpoint import load_checkpoint, latest_checkpoint

    q, d = pair_data()
    optim = OptimSection(batch_size=8, lr=1e-2, epochs=2, warmup_ratio=0.0)
    seen = {}

    def run(**kwargs):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
        torch.manual_seed(1)
        for p in model.parameters():
            nn.init.normal_(p, std=0.3)
        first = list(model[0].parameters())

        def check():
            seen["grads"] = [p.grad for p in first]

        stages = [Stage("a", len(q), PairStep(q, d), first, optim),
                  Stage("b", len(q), PairStep(q, d), list(model[1].parameters()), optim, on_start=check)]
        return model, train(model, stages, seed=3, **kwargs)

    whole, res_whole = run(checkpoint=CheckpointConfig(tmp_path / "whole"), fingerprint="f")
    assert seen["grads"] == [None, None]
    _, opt_state, _ = load_checkpoint(latest_checkpoint(tmp_path / "whole"))
    assert opt_state["#0"]["optimizer"]["state"] == {}  # the first optimizer's AdamW moments are gone
    assert len(opt_state["#1"]["optimizer"]["state"]) == 2  # the last one's are saved before it is freed

    kill = _kill_at(11)

    ckpt = CheckpointConfig(tmp_path / "ck", every_steps=2)
    with pytest.raises(StopRun):
        run(checkpoint=ckpt, fingerprint="f", progress=kill)
    resumed, res = run(checkpoint=ckpt, fingerprint="f")
    for a, b in zip(whole.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert [r["loss"] for r in res.loss_history] == [r["loss"] for r in res_whole.loss_history]
