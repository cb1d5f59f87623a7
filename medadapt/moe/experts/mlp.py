"""MLP experts (paper §III-B): ``h -> expansion*h -> h`` with a GELU or SwiGLU non-linearity."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.moe.experts.registry import register_expert

__all__ = ["MLPGeluExpert", "MLPSwiGLUExpert", "zero_linear_"]


def zero_linear_(layer: nn.Linear) -> nn.Linear:
    """Zero a linear layer's weight and bias in place so it outputs exactly 0 (identity-preserving heads)."""
    nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    return layer


@register_expert("mlp_gelu")
class MLPGeluExpert(nn.Module):
    """``Linear(h, e*h) -> GELU -> Linear(e*h, h)``; ``zero_init_output``: the expert starts as zero."""

    def __init__(self, dim: int, expansion: int = 4, zero_init_output: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.up = nn.Linear(dim, expansion * dim, bias=bias)
        self.down = nn.Linear(expansion * dim, dim, bias=bias)
        if zero_init_output:
            zero_linear_(self.down)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.gelu(self.up(x)))


@register_expert("mlp_swiglu")
class MLPSwiGLUExpert(nn.Module):
    """``Linear(e*h, h)( Swish(x W) * (x V) )`` with ``W, V: h -> e*h`` (Shazeer 2020; paper §III-B), fused into
    one ``h -> 2*e*h`` projection; Swish with beta = 1 (SiLU)."""

    def __init__(self, dim: int, expansion: int = 4, zero_init_output: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.gate_up = nn.Linear(dim, 2 * expansion * dim, bias=bias)
        self.down = nn.Linear(expansion * dim, dim, bias=bias)
        if zero_init_output:
            zero_linear_(self.down)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)
