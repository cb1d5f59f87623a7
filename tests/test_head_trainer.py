"""Med-MoE-Embed's schedule on the one loop (medadapt.moe.schedule): a synthetic task a head can solve, the
two-step schedule, determinism, resume, accumulation (random routing included) and consistency with the
attached model."""

from __future__ import annotations

import pytest
import torch
from sentence_transformers import SentenceTransformer

from medadapt.errors import ConfigError
from medadapt.adapters import attach
from medadapt.moe import InfoNCESection, MoEConfig, MoEHead, MoETrainingSection, encode_with_head, train_head
from medadapt.training import CheckpointConfig, TrainingError, latest_checkpoint

DIM = 32


pytestmark = pytest.mark.usefixtures("_single_thread")


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


def schedule(**fields) -> MoETrainingSection:
    base = dict(epochs=1, shared_epochs=1, random_routing_epochs=1, batch_size=32, lr=5e-3, weight_decay=0.01,
                warmup_ratio=0.05, seed=0)
    return MoETrainingSection(**{**base, **fields})


def fresh(config: MoEConfig | None = None) -> MoEHead:
    torch.manual_seed(0)
    return MoEHead(config or MoEConfig.paper(DIM))


@pytest.mark.parametrize("config", [MoEConfig.paper(DIM), MoEConfig.single_expert(DIM, "mlp_gelu")],
                         ids=["moe_paper", "single_mlp_gelu"])
def test_train_head_learns_synthetic_task(config):
    queries, docs, negatives = rotated_pairs(768, seed=0)
    held_q, held_d, _ = rotated_pairs(256, seed=1)
    head = fresh(config)
    before = top1(head, held_q, held_d)
    result = train_head(head, queries, docs, negatives, schedule(epochs=4, shared_epochs=2, batch_size=64))
    after = top1(head, held_q, held_d)
    history = [row["loss"] for row in result.loss_history]
    assert before < 0.1 and after > 0.7, (before, after)
    assert sum(history[-5:]) < 0.5 * sum(history[:5])
    assert all(set(row) == {"stage", "step", "epoch", "loss", "infonce", "load_balance", "lr"}
               for row in result.loss_history)
    assert all(row["loss"] == pytest.approx(row["infonce"] + row["load_balance"], abs=1e-6)
               for row in result.loss_history)
    expected_stages = ["shared", "random", "learned"] if config.routed_experts else ["shared", "learned"]
    steps = {"shared": 24, "random": 12, "learned": 48}  # 12 steps per epoch
    assert result.stage_steps == {s: steps[s] for s in expected_stages} and len(history) == result.steps
    assert [r["stage"] for r in result.loss_history][:24] == ["shared"] * 24
    assert head.routing == config.routing
    if config.routed_experts:  # the learned stage routes and balances; its statistics are reported
        learned = [r for r in result.loss_history if r["stage"] == "learned"]
        assert all(r["load_balance"] > 0 for r in learned)
        assert result.routing_stats["inputs_seen"] == 4 * 768 * 4  # 4 epochs x 768 pairs x (q, pos, 2 negs)
        assert sum(result.routing_stats["running_counts"]) == 2 * result.routing_stats["inputs_seen"]  # top-2


def test_load_balancing_moves_the_gate():
    """The Switch term reaches the optimiser: two runs that differ only in ``load_balance_weight`` end with
    different centroids (if the term were logged but detached, both would train the same gate)."""
    queries, docs, negatives = rotated_pairs(128, seed=0)
    centroids = []
    for weight in (0.0, 0.5):
        head = fresh()
        train_head(head, queries, docs, negatives, schedule(epochs=1, shared_epochs=0, random_routing_epochs=0),
                   InfoNCESection(load_balance_weight=weight))
        centroids.append(head.router.centroids.detach().clone())
    assert not torch.allclose(centroids[0], centroids[1], atol=1e-6)


def test_shared_stage_updates_only_shared_experts_and_reports_progress():
    queries, docs, _ = rotated_pairs(128, seed=0)
    head = fresh()
    groups = head.parameter_groups()
    routed_before = [p.detach().clone() for p in groups["routed"] + groups["gate"]]
    shared_before = [p.detach().clone() for p in groups["shared"]]
    events = []
    result = train_head(head, queries, docs, None, schedule(epochs=0, random_routing_epochs=0),
                        progress=lambda stage, step, total, row: events.append((stage, step, total)))
    assert all(torch.equal(a, b) for a, b in zip(routed_before, groups["routed"] + groups["gate"]))
    assert any(not torch.equal(a, b) for a, b in zip(shared_before, groups["shared"]))
    assert events == [("shared", s, 4) for s in range(1, 5)] and result.stage_steps == {"shared": 4}
    assert all(row["load_balance"] == 0.0 for row in result.loss_history)


def test_random_and_learned_stages_share_one_learning_rate_schedule():
    queries, docs, _ = rotated_pairs(128, seed=0)
    result = train_head(fresh(), queries, docs, None,
                        schedule(epochs=1, random_routing_epochs=1, warmup_ratio=0.0, scheduler="linear"))
    lr = {r["step"]: r["lr"] for r in result.loss_history}
    assert lr[1] == lr[5] == pytest.approx(5e-3)  # each of the two schedules starts at the peak
    assert lr[9] == pytest.approx(5e-3 * 4 / 8)  # halfway through random + learned: one decay over both


def test_training_is_deterministic_given_seed():
    queries, docs, negatives = rotated_pairs(96, seed=0)
    runs = []
    for _ in range(2):
        head = fresh()
        result = train_head(head, queries, docs, negatives, schedule(seed=7))
        runs.append((result.loss_history, [p.detach().clone() for p in head.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_accumulation_equals_the_large_batch_in_every_stage():
    """k chunks of b give the step of one batch of k * b: InfoNCE and the load-balancing loss are computed
    on the whole step, and random routing gives each chunk its rows of the step's one draw."""
    queries, docs, negatives = rotated_pairs(128, seed=0)
    big, small = fresh(), fresh()
    res_big = train_head(big, queries, docs, negatives, schedule(batch_size=64))
    res_acc = train_head(small, queries, docs, negatives,
                         schedule(batch_size=16, gradient_accumulation_steps=4))
    assert [r["stage"] for r in res_acc.loss_history] == [r["stage"] for r in res_big.loss_history]
    for a, b in zip(res_acc.loss_history, res_big.loss_history):
        for key in ("loss", "infonce", "load_balance"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (key, a, b)
    for a, b in zip(big.parameters(), small.parameters()):  # Adam amplifies float rounding of tiny gradients
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    for key in ("running_counts", "inputs_seen"):  # GradCache's two passes count each input once
        assert res_acc.routing_stats[key] == res_big.routing_stats[key]


def test_encode_with_head_matches_attached_model(tiny_bert):
    head = fresh()
    queries, docs, negatives = rotated_pairs(64, seed=0)
    train_head(head, queries, docs, negatives, schedule(random_routing_epochs=0))
    texts = ["fever and cough", "joint pain in the knee", "itchy rash"]
    backbone = SentenceTransformer(modules=[tiny_bert[0], tiny_bert[1]], device="cpu")  # no Normalize: raw
    raw = backbone.encode(texts, convert_to_tensor=True)
    cached = encode_with_head(head, raw, batch_size=2)
    attached = attach(tiny_bert, head).encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(cached, attached, atol=1e-6, rtol=0)
    torch.testing.assert_close(cached.norm(dim=-1), torch.ones(3))
    assert not head.training


class LinearHead(torch.nn.Module):
    """A head that is not a MoEHead: one linear map of the sentence embedding."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(DIM, DIM)

    def forward(self, features):
        return {**features, "sentence_embedding": self.linear(features["sentence_embedding"])}


def test_other_heads_train_in_one_stage_without_load_balancing():
    queries, docs, negatives = rotated_pairs(128, seed=0)
    torch.manual_seed(0)
    head = LinearHead()
    result = train_head(head, queries, docs, negatives,
                        schedule(epochs=3, shared_epochs=0, random_routing_epochs=0))
    assert result.stage_steps == {"main": 12} and result.routing_stats == {}
    assert set(result.loss_history[0]) == {"stage", "step", "epoch", "loss", "infonce", "lr"}
    assert result.loss_history[-1]["loss"] < result.loss_history[0]["loss"]
    with pytest.raises(ConfigError, match="need a MoEHead"):
        train_head(LinearHead(), queries, docs, negatives, schedule())


def test_bad_inputs_are_refused():
    head = MoEHead(MoEConfig.single_expert(DIM))
    with pytest.raises(ConfigError, match="neg_emb"):
        train_head(head, torch.randn(4, DIM), torch.randn(4, DIM), torch.randn(4, DIM))
    with pytest.raises(ConfigError, match="pos_emb"):
        train_head(head, torch.randn(4, DIM), torch.randn(5, DIM))
    with pytest.raises(ConfigError, match="needs an accelerator"):
        train_head(head, torch.randn(4, DIM), torch.randn(4, DIM),
                   training=MoETrainingSection(mixed_precision="bf16"))
    with pytest.raises(ValueError, match="temperature"):
        InfoNCESection(temperature=0)


class _Kill(Exception):
    pass


def test_resume_after_kill_reproduces_uninterrupted_run(tmp_path):
    queries, docs, negatives = rotated_pairs(256, seed=0)
    cfg = schedule(epochs=2, batch_size=64, checkpoint_every_steps=3)
    reference = fresh()
    full = train_head(reference, queries, docs, negatives, cfg)

    def killer(stage, step, total, row):
        if step == 7:
            raise _Kill

    with pytest.raises(_Kill):
        train_head(fresh(), queries, docs, negatives, cfg, progress=killer, checkpoint=tmp_path / "ckpt")
    ckpt = CheckpointConfig(tmp_path / "ckpt", every_steps=3)
    assert latest_checkpoint(ckpt.directory).name == "step-00000006"
    assert not list(ckpt.directory.glob(".tmp-*"))
    resumed_head = fresh()  # a new process: fresh weights, state comes from the checkpoint
    resumed = train_head(resumed_head, queries, docs, negatives, cfg, checkpoint=tmp_path / "ckpt")
    assert resumed.loss_history == full.loss_history
    for (name, p), q in zip(reference.state_dict().items(), resumed_head.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    with pytest.raises(TrainingError, match="another run"):  # the same rows in another order: refused
        train_head(fresh(), queries.flip(0), docs.flip(0), negatives.flip(0), cfg,
                   checkpoint=tmp_path / "ckpt")


def test_train_head_under_accelerate_matches_plain_loop():
    from accelerate import Accelerator

    queries, docs, negatives = rotated_pairs(128, seed=0)
    cfg = schedule(batch_size=64)
    a, b = fresh(), fresh()
    ra = train_head(a, queries, docs, negatives, cfg)
    rb = train_head(b, queries, docs, negatives, cfg, accelerator=Accelerator(cpu=True))
    assert [r["loss"] for r in ra.loss_history] == pytest.approx([r["loss"] for r in rb.loss_history],
                                                                  rel=1e-5)
    assert ra.routing_stats == rb.routing_stats
