"""The KAN experts (paper §III-B) on :mod:`medadapt.moe.kan`'s layers (options: :class:`~medadapt.moe.kan.KANOptions`):
``kan``, two KAN layers ``h -> e*h -> h``, and ``mlp_kan``, ``Linear -> KAN(e*h, e*h) -> Linear`` whose KAN layer
has ``groups`` diagonal blocks (default 16, our choice: a full ``4h x 4h`` layer has 19M coefficients at h = 384,
~16x the MLP's FLOPs; 16 blocks cost about one linear projection).
"""

from __future__ import annotations

from torch import Tensor, nn

from medadapt.moe.experts.mlp import zero_linear_
from medadapt.moe.experts.registry import register_expert
from medadapt.moe.kan import KANBackend, KANLayer, KANOptions, SquashKind

__all__ = ["KANExpert", "MLPKANExpert"]


@register_expert("kan")
class KANExpert(nn.Module):
    """``KAN(h, e*h) -> KAN(e*h, h)``."""

    def __init__(self, dim: int, expansion: int = 4, zero_init_output: bool = True, grid_size: int = 5,
                 spline_order: int = 3, grid_range: tuple[float, float] = (-1.0, 1.0),
                 squash: SquashKind = "layernorm_tanh", backend: KANBackend = "fast", groups: int = 1,
                 base_init_scale: float = 1.0, spline_init_scale: float = 0.1) -> None:
        super().__init__()
        options = KANOptions(grid_size, spline_order, tuple(grid_range), squash, backend, groups, base_init_scale,
                             spline_init_scale)
        self.up = KANLayer(dim, expansion * dim, options)
        self.down = KANLayer(expansion * dim, dim, options, zero_init=zero_init_output)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.up(x))


@register_expert("mlp_kan")
class MLPKANExpert(nn.Module):
    """``Linear(h, e*h) -> KAN(e*h, e*h; groups) -> Linear(e*h, h)`` (``bias``: of the linear projections)."""

    def __init__(self, dim: int, expansion: int = 4, zero_init_output: bool = True, bias: bool = True,
                 groups: int = 16, grid_size: int = 5, spline_order: int = 3,
                 grid_range: tuple[float, float] = (-1.0, 1.0), squash: SquashKind = "layernorm_tanh",
                 backend: KANBackend = "fast", base_init_scale: float = 1.0, spline_init_scale: float = 0.1) -> None:
        super().__init__()
        hidden = expansion * dim
        options = KANOptions(grid_size, spline_order, tuple(grid_range), squash, backend, groups, base_init_scale,
                             spline_init_scale)
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.activation = KANLayer(hidden, hidden, options)
        self.down = nn.Linear(hidden, dim, bias=bias)
        if zero_init_output:
            zero_linear_(self.down)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.activation(self.up(x)))
