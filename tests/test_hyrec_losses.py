"""HyReC losses: union cross-entropy (eq. 13) and the named, weighted total (eq. 12-14)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from medadapt.errors import ConfigError
from medadapt.losses import HyReCLoss, InfoNCELoss, UnionCELoss


def test_union_ce_ignores_special_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4)
    labels = torch.tensor([[-100, 1, 3], [0, -100, -100]])
    got = UnionCELoss()(logits, labels)["union"]
    keep = labels != -100
    want = F.cross_entropy(logits[keep], labels[keep])
    assert got == pytest.approx(float(want))
    assert UnionCELoss()(logits, torch.full((2, 3), -100))["union"] == 0
    with pytest.raises(ValueError):
        UnionCELoss()(logits, labels[:, :2])


def test_hyrec_loss_parts_and_weights():
    torch.manual_seed(0)
    q, p, n = torch.rand(4, 50), torch.rand(4, 50), torch.rand(4, 2, 50)
    qd, pd, nd = torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 2, 8)
    logits, labels = torch.randn(1, 10, 4), torch.randint(0, 4, (1, 10))
    out = HyReCLoss(0.05, lexical_weight=2.0, dense_weight=1.0, union_weight=0.5)(
        lexical=(q, p, n), dense=(qd, pd, nd), union=(logits, labels))
    ref = InfoNCELoss(0.05)
    assert out["lexical"] == pytest.approx(float(ref(q, p, n)["infonce"]))
    assert out["dense"] == pytest.approx(float(ref(qd, pd, nd)["infonce"]))
    assert out["union"] == pytest.approx(float(F.cross_entropy(logits[0], labels[0])))
    assert out["loss"] == pytest.approx(float(2 * out["lexical"] + out["dense"] + 0.5 * out["union"]), rel=1e-5)


def test_hyrec_loss_skips_zero_weighted_parts_and_validates():
    q = torch.rand(3, 5)
    out = HyReCLoss(union_weight=0, dense_weight=0)(lexical=(q, q, None))
    assert set(out) == {"lexical", "loss"}
    with pytest.raises(ValueError, match="dense"):
        HyReCLoss()(lexical=(q, q, None))
    with pytest.raises(ConfigError):
        HyReCLoss(lexical_weight=0, dense_weight=0, union_weight=0)
    with pytest.raises(ConfigError):
        HyReCLoss(temperature=0)


def test_hybrid_term_is_infonce_on_lexical_plus_weighted_dense_by_hand():
    torch.manual_seed(1)
    q, p, n = torch.rand(3, 20), torch.rand(3, 20), torch.rand(3, 2, 20)
    qd, pd, nd = torch.randn(3, 6), torch.randn(3, 6), torch.randn(3, 2, 6)
    loss = HyReCLoss(0.1, lexical_weight=0, dense_weight=0, union_weight=0, hybrid_weight=0.5,
                     hybrid_dense_weight=2.0)
    out = loss(hybrid=((q, p, n), (qd, pd, nd)))
    assert set(out) == {"hybrid", "loss"}

    def cos(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    cands_l = [*p, *n.reshape(-1, 20)]
    cands_d = [*pd, *nd.reshape(-1, 6)]
    want = 0.0
    for i in range(3):  # by hand: -log softmax over every positive and every hard negative of the batch
        s = torch.tensor([(cos(q[i], cl) + 2.0 * cos(qd[i], cd)) / 0.1 for cl, cd in zip(cands_l, cands_d)])
        want += float(-(s[i] - torch.logsumexp(s, 0))) / 3
    assert float(out["hybrid"]) == pytest.approx(want, rel=1e-5)
    assert float(out["loss"]) == pytest.approx(0.5 * want, rel=1e-5)


def test_hybrid_term_trains_the_lexical_side_only_when_dense_is_fixed_and_needs_inputs():
    torch.manual_seed(2)
    q = torch.rand(4, 10, requires_grad=True)
    p = torch.rand(4, 10)
    qd, pd = torch.randn(4, 5), torch.randn(4, 5)  # fixed: no gradient
    out = HyReCLoss(lexical_weight=1, dense_weight=0, union_weight=0, hybrid_weight=1)(
        lexical=(q, p, None), hybrid=((q, p, None), (qd, pd, None)))
    out["loss"].backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    # a dense side that already ranks every positive first lowers the fused loss below the lexical one
    sure = HyReCLoss(lexical_weight=0, dense_weight=0, union_weight=0, hybrid_weight=1, hybrid_dense_weight=1)
    eye = torch.eye(4)
    assert float(sure(hybrid=((q, p, None), (eye, eye, None)))["hybrid"]) < float(out["lexical"])
    with pytest.raises(ValueError, match="hybrid"):
        HyReCLoss(union_weight=0, hybrid_weight=1)(lexical=(q, p, None), dense=(qd, pd, None))
    with pytest.raises(ConfigError):
        HyReCLoss(hybrid_weight=-1)
