"""Losses: InfoNCE against hand-computed values, and the Switch load-balancing term."""

from __future__ import annotations

import math

import pytest
import torch

from medadapt.errors import ConfigError
from medadapt.losses import InfoNCELoss, LoadBalanceLoss, switch_load_balance


pytestmark = pytest.mark.usefixtures("_single_thread")


def test_infonce_matches_hand_computed_2x2():
    query = torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # cosine: norms do not matter
    positive = torch.tensor([[3.0, 0.0], [1.0, 1.0]])
    c = 1 / math.sqrt(2)  # cos(q0, p1) = cos(q1, p1); cos(q0, p0) = 1; cos(q1, p0) = 0
    row0 = -math.log(math.exp(1.0) / (math.exp(1.0) + math.exp(c)))
    row1 = -math.log(math.exp(c) / (math.exp(0.0) + math.exp(c)))
    parts = InfoNCELoss(temperature=1.0)(query, positive)
    assert set(parts) == {"infonce"}
    assert parts["infonce"].item() == pytest.approx((row0 + row1) / 2, abs=1e-6)

    # One hard negative per query joins every query's denominator (in-batch sharing, paper eq. 3).
    negatives = torch.tensor([[[0.0, 1.0]], [[1.0, 0.0]]])  # cos with q0: 0 and 1; with q1: 1 and 0
    row0 = -math.log(math.exp(1.0) / (math.exp(1.0) + math.exp(c) + math.exp(0.0) + math.exp(1.0)))
    row1 = -math.log(math.exp(c) / (math.exp(0.0) + math.exp(c) + math.exp(1.0) + math.exp(0.0)))
    parts = InfoNCELoss(temperature=1.0)(query, positive, negatives)
    assert parts["infonce"].item() == pytest.approx((row0 + row1) / 2, abs=1e-6)

    # temperature 0.5 divides every cosine by 0.5 (paper eq. 3's tau)
    t = 0.5
    row0 = -math.log(math.exp(1 / t) / (math.exp(1 / t) + math.exp(c / t) + math.exp(0.0) + math.exp(1 / t)))
    row1 = -math.log(math.exp(c / t) / (math.exp(0.0) + math.exp(c / t) + math.exp(1 / t) + math.exp(0.0)))
    parts = InfoNCELoss(temperature=t)(query, positive, negatives)
    assert parts["infonce"].item() == pytest.approx((row0 + row1) / 2, abs=1e-6)


def test_infonce_decreases_as_embeddings_align():
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(16, 8, generator=generator)
    loss = InfoNCELoss(temperature=0.05)
    values = []
    for noise in [10.0, 1.0, 0.1, 0.0]:
        positive = query + noise * torch.randn(16, 8, generator=generator)
        values.append(loss(query, positive)["infonce"].item())
    assert values == sorted(values, reverse=True)
    assert values[-1] < 0.01


def test_infonce_validates_inputs():
    with pytest.raises(ConfigError):
        InfoNCELoss(temperature=0.0)
    with pytest.raises(ValueError, match="negatives"):
        InfoNCELoss()(torch.randn(4, 3), torch.randn(4, 3), torch.randn(3, 2, 3))


def test_load_balance_is_one_when_uniform_and_grows_with_skew():
    n, experts = 64, 4
    uniform_probs = torch.full((n, experts), 1 / experts)
    uniform_selected = torch.zeros(n, experts, dtype=torch.bool)
    uniform_selected[torch.arange(n), torch.arange(n) % experts] = True
    skewed_probs = torch.tensor([0.85, 0.05, 0.05, 0.05]).expand(n, experts)
    skewed_selected = torch.zeros(n, experts, dtype=torch.bool)
    skewed_selected[:, 0] = True
    uniform = switch_load_balance(uniform_probs, uniform_selected)
    skewed = switch_load_balance(skewed_probs, skewed_selected)
    assert uniform.item() == pytest.approx(1.0)
    assert skewed.item() == pytest.approx(experts * 0.85)
    assert uniform < skewed


def test_load_balance_gradient_pushes_probs_of_overloaded_expert_down():
    logits = torch.zeros(8, 3, requires_grad=True)
    selected = torch.zeros(8, 3, dtype=torch.bool)
    selected[:, 0] = True
    switch_load_balance(torch.softmax(logits, -1), selected).backward()
    assert (logits.grad[:, 0] > 0).all() and (logits.grad[:, 1:] < 0).all()


def test_load_balance_loss_weights_tensor_or_head_stats():
    class FakeHead:
        last_aux_loss = torch.tensor(2.0)

    loss = LoadBalanceLoss(weight=0.01)
    assert loss(torch.tensor(2.0))["load_balance"].item() == pytest.approx(0.02)
    assert loss(FakeHead())["load_balance"].item() == pytest.approx(0.02)
    with pytest.raises(ConfigError):
        LoadBalanceLoss(weight=-1.0)


def test_contrastive_scores_stay_float32_under_bf16_autocast():
    """Near-identical embeddings (a random-init tower: cosines ~0.994, differing by ~3e-4) are below bf16's
    resolution near 1 (2^-8): with the matmul autocast to bf16 every logit rounded to one value and the loss
    read exactly ln(B) (seen on an H100). The losses compute their similarities in float32 instead."""
    from medadapt.losses import AsymInfoNCELoss, LearnableTemperatureInfoNCELoss

    torch.manual_seed(0)
    base = torch.randn(768)
    q, p = base + 0.08 * torch.randn(64, 768), base + 0.08 * torch.randn(64, 768)
    for loss, key in ((InfoNCELoss(0.05), "infonce"), (LearnableTemperatureInfoNCELoss(0.05), "loss"),
                      (AsymInfoNCELoss(0.05), "asym_infonce")):
        exact = loss(q, p)[key]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = loss(q, p)[key]
        assert mixed.dtype == torch.float32
        assert abs(float(exact) - math.log(64)) > 5e-4  # the spread is real in float32 ...
        assert float(mixed) == pytest.approx(float(exact), rel=1e-6)  # ... and survives autocast
