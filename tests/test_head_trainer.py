"""Training heads on cached embeddings: a synthetic task a head can solve, the two-step schedule,
determinism, and consistency with the attached model."""

from __future__ import annotations

import pytest
import torch
from sentence_transformers import SentenceTransformer

from medadapt.errors import ConfigError
from medadapt.heads import MoEConfig, MoEHead, attach
from medadapt.training.head_trainer import HeadTrainConfig, TrainProgress, encode_with_head, train_head

DIM = 32


@pytest.fixture(autouse=True)
def _single_thread():
    """These tensors are tiny: intra-op threading only adds overhead (and stalls on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def rotated_pairs(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Documents ``[3a, b]``; queries ``[3a R, b] + noise`` with a fixed random rotation ``R`` of the
    high-variance half. Raw cosine retrieval fails (the scrambled half dominates); a symmetric head solves the
    task by learning to suppress that half. Hard negatives are random other documents."""
    half = DIM // 2
    rotation = torch.linalg.qr(torch.randn(half, half, generator=torch.Generator().manual_seed(123)))[0]
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(n, half, generator=g), torch.randn(n, half, generator=g)
    docs = torch.cat([3 * a, b], dim=1)
    queries = torch.cat([3 * a @ rotation, b], dim=1) + 0.3 * torch.randn(n, DIM, generator=g)
    negatives = docs[torch.randint(0, n, (n, 2), generator=g)]
    return queries, docs, negatives


def top1(head: torch.nn.Module, queries: torch.Tensor, docs: torch.Tensor) -> float:
    scores = encode_with_head(head, queries) @ encode_with_head(head, docs).T
    return (scores.argmax(1) == torch.arange(len(queries))).float().mean().item()


FAST = HeadTrainConfig(epochs=4, shared_epochs=2, random_routing_epochs=1, batch_size=64, lr=5e-3)


@pytest.mark.parametrize("config", [MoEConfig.paper(DIM), MoEConfig.single_expert(DIM, "mlp_gelu")],
                         ids=["moe_paper", "single_mlp_gelu"])
def test_train_head_learns_synthetic_task(config):
    queries, docs, negatives = rotated_pairs(768, seed=0)
    held_q, held_d, _ = rotated_pairs(256, seed=1)
    torch.manual_seed(0)
    head = MoEHead(config)
    before = top1(head, held_q, held_d)
    result = train_head(head, queries, docs, negatives, FAST)
    after = top1(head, held_q, held_d)
    history = [row["loss"] for row in result.loss_history]
    assert before < 0.1 and after > 0.7, (before, after)
    assert sum(history[-5:]) < 0.5 * sum(history[:5])
    keys = {"step", "epoch", "loss", "infonce", "load_balance", "lr"}
    assert all(set(row) >= keys for row in result.loss_history)
    assert result.seconds > 0 and len(history) == sum(result.stage_steps.values())
    expected_stages = ["shared", "random", "learned"] if config.routed_experts else ["shared", "learned"]
    assert list(result.stage_steps) == expected_stages
    assert head.routing == config.routing


def test_shared_stage_updates_only_shared_experts_and_schedule_is_reported():
    queries, docs, negatives = rotated_pairs(128, seed=0)
    torch.manual_seed(0)
    head = MoEHead(MoEConfig.paper(DIM))
    groups = head.parameter_groups()
    routed_before = [p.detach().clone() for p in groups["routed"] + groups["gate"]]
    shared_before = [p.detach().clone() for p in groups["shared"]]
    events: list[TrainProgress] = []
    config = HeadTrainConfig(epochs=0, shared_epochs=1, random_routing_epochs=0, batch_size=32)
    result = train_head(head, queries, docs, None, config, progress=events.append)
    assert all(torch.equal(a, b) for a, b in zip(routed_before, groups["routed"] + groups["gate"]))
    assert any(not torch.equal(a, b) for a, b in zip(shared_before, groups["shared"]))
    assert [e.step for e in events] == list(range(1, 5)) and {e.total_steps for e in events} == {4}
    assert {e.stage for e in events} == {"shared"} and result.stage_steps == {"shared": 4}
    assert all(row["load_balance"] == 0.0 for row in result.loss_history)


def test_training_is_deterministic_given_seed():
    queries, docs, negatives = rotated_pairs(96, seed=0)
    config = HeadTrainConfig(epochs=1, shared_epochs=1, random_routing_epochs=1, batch_size=32, seed=7)
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        head = MoEHead(MoEConfig.paper(DIM))
        result = train_head(head, queries, docs, negatives, config)
        runs.append((result.loss_history, [p.detach().clone() for p in head.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_encode_with_head_matches_attached_model(tiny_bert):
    torch.manual_seed(0)
    head = MoEHead(MoEConfig.paper(DIM))
    queries, docs, negatives = rotated_pairs(64, seed=0)
    train_head(head, queries, docs, negatives, HeadTrainConfig(epochs=1, shared_epochs=1, batch_size=32))
    texts = ["fever and cough", "joint pain in the knee", "itchy rash"]
    backbone = SentenceTransformer(modules=[tiny_bert[0], tiny_bert[1]], device="cpu")  # no Normalize: raw
    raw = backbone.encode(texts, convert_to_tensor=True)
    cached = encode_with_head(head, raw, batch_size=2)
    attached = attach(tiny_bert, head).encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(cached, attached, atol=1e-6, rtol=0)
    torch.testing.assert_close(cached.norm(dim=-1), torch.ones(3))
    assert not head.training


def test_head_train_config_validation():
    with pytest.raises(ConfigError, match="valid keys"):
        HeadTrainConfig.from_dict({"epochs": 1, "learning_rate": 1e-3})
    with pytest.raises(ConfigError, match="scheduler"):
        HeadTrainConfig(scheduler="step")
    assert HeadTrainConfig.from_dict(HeadTrainConfig(lr=1e-4).to_dict()).lr == 1e-4
    with pytest.raises(ValueError, match="neg_emb"):
        train_head(MoEHead(MoEConfig.single_expert(DIM)), torch.randn(4, DIM), torch.randn(4, DIM),
                   torch.randn(4, DIM), HeadTrainConfig())


class _Kill(Exception):
    pass


def test_resume_after_kill_reproduces_uninterrupted_run(tmp_path):
    from medadapt.training.checkpoint import CheckpointConfig, latest_checkpoint

    queries, docs, negatives = rotated_pairs(256, seed=0)
    cfg = HeadTrainConfig(epochs=2, shared_epochs=1, random_routing_epochs=1, batch_size=64, lr=5e-3)

    def fresh():
        torch.manual_seed(0)
        return MoEHead(MoEConfig.paper(DIM))

    reference = fresh()
    full = train_head(reference, queries, docs, negatives, cfg)

    def killer(p: TrainProgress):
        if p.step == 7:
            raise _Kill

    ckpt = CheckpointConfig(tmp_path / "ckpt", every_steps=3)
    head = fresh()
    with pytest.raises(_Kill):
        train_head(head, queries, docs, negatives, cfg, progress=killer, checkpoint=ckpt)
    assert latest_checkpoint(ckpt.directory).name == "step-00000006"
    assert not list(ckpt.directory.glob(".tmp-*"))
    resumed_head = fresh()  # a new process: fresh weights, state comes from the checkpoint
    resumed = train_head(resumed_head, queries, docs, negatives, cfg, checkpoint=ckpt)
    assert [r["step"] for r in resumed.loss_history] == [r["step"] for r in full.loss_history]
    for a, b in zip(resumed.loss_history, full.loss_history):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
    for (name, p), q in zip(reference.state_dict().items(), resumed_head.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(ConfigError, match="different run"):
        train_head(fresh(), queries[:128], docs[:128], negatives[:128], cfg, checkpoint=ckpt)


def test_train_head_under_accelerate_matches_plain_loop():
    from accelerate import Accelerator

    queries, docs, negatives = rotated_pairs(128, seed=0)
    cfg = HeadTrainConfig(epochs=1, shared_epochs=1, random_routing_epochs=0, batch_size=64, lr=5e-3)
    torch.manual_seed(0)
    a = MoEHead(MoEConfig.paper(DIM))
    torch.manual_seed(0)
    b = MoEHead(MoEConfig.paper(DIM))
    ra = train_head(a, queries, docs, negatives, cfg)
    rb = train_head(b, queries, docs, negatives, cfg, accelerator=Accelerator(cpu=True))
    assert [r["loss"] for r in ra.loss_history] == pytest.approx([r["loss"] for r in rb.loss_history], rel=1e-5)
