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
