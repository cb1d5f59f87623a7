"""Nothing non-finite is written (issue 43, "NaN head weights saved"): :func:`medadapt.finite.check_finite_tensors`
names the tensors holding NaN / inf, for torch and numpy, every float width, and lets integers through."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medadapt.errors import MedAdaptError
from medadapt.finite import check_finite_tensors, non_finite_tensors


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("make", [
    lambda v: torch.tensor([1.0, v]),
    lambda v: torch.tensor([1.0, v], dtype=torch.bfloat16),
    lambda v: torch.tensor([1.0, v], dtype=torch.float16),
    lambda v: torch.tensor([1.0, v], dtype=torch.float64).reshape(2, 1),
    lambda v: torch.complex(torch.tensor([1.0, v]), torch.zeros(2)),
    lambda v: np.array([1.0, v], dtype=np.float32),
    lambda v: np.array([[1.0], [v]], dtype=np.float16),
], ids=["f32", "bf16", "f16", "f64", "complex", "np32", "np16"])
def test_non_finite_tensors_are_named_and_refused(make, bad):
    tensors = {"moe.gate.weight": torch.zeros(3), "moe.experts.0.w1": make(bad), "steps": torch.tensor([7])}
    assert non_finite_tensors(tensors) == ["moe.experts.0.w1"]
    with pytest.raises(MedAdaptError) as err:
        check_finite_tensors(tensors, "adapter 'keep'")
    assert str(err.value) == ("cannot write adapter 'keep': moe.experts.0.w1 holds NaN or infinity (weights that "
                              "encode every text to NaN); nothing was written")


def test_finite_integer_and_empty_tensors_pass():
    tensors = {"a": torch.randn(4, 4), "b": torch.arange(3), "c": torch.empty(0),
               "d": np.ones(3, dtype=np.float32), "e": np.arange(3), "f": torch.tensor([True])}
    assert non_finite_tensors(tensors) == []
    check_finite_tensors(tensors, "x")  # raises on any


def test_many_bad_tensors_are_counted():
    tensors = {f"w{i}": torch.full((2,), float("nan")) for i in range(5)}
    with pytest.raises(MedAdaptError, match=r"cannot write x: w0, w1, w2 \(and 2 more\) hold NaN or infinity"):
        check_finite_tensors(tensors, "x")
