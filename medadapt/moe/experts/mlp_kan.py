"""MLP-KAN expert (paper §III-B): ``Linear(h, e*h) -> KAN(e*h, e*h) -> Linear(e*h, h)``.

The KAN layer is block-diagonal with ``groups`` blocks (default 16; our choice, the paper does not say): a
full ``4h x 4h`` KAN layer has ``(4h)^2 * (G + k)`` coefficients (19M at h = 384), ~16x the MLP's FLOPs,
while 16 blocks cost about one linear projection. ``groups = 1`` is the full layer, ``groups = e*h`` a
per-channel learnable activation.
"""

from __future__ import annotations

from torch import Tensor, nn

from medadapt.moe.experts.mlp import zero_linear_
from medadapt.moe.experts.registry import register_expert
from medadapt.heads.kan import KANBackend, KANLayer, KANOptions, SquashKind

__all__ = ["MLPKANExpert"]


@register_expert("mlp_kan")
class MLPKANExpert(nn.Module):
    """``Linear(h, e*h) -> KAN(e*h, e*h; groups) -> Linear(e*h, h)``.

    Args:
        dim: embedding width ``h``.
        expansion: hidden width multiplier ``e`` (paper: 4).
        zero_init_output: zero the output projection so the expert starts as the zero function.
        bias: use biases in the linear projections.
        groups: block-diagonal blocks of the middle KAN layer (must divide ``e*h``; see module docstring).
        grid_size, spline_order, grid_range, squash, backend, base_init_scale, spline_init_scale:
            see :class:`~medadapt.heads.kan.KANOptions` (``backend="pykan"`` needs ``groups=1``).
    """

    def __init__(
        self,
        dim: int,
        expansion: int = 4,
        zero_init_output: bool = True,
        bias: bool = True,
        groups: int = 16,
        grid_size: int = 5,
        spline_order: int = 3,
        grid_range: tuple[float, float] = (-1.0, 1.0),
        squash: SquashKind = "layernorm_tanh",
        backend: KANBackend = "fast",
        base_init_scale: float = 1.0,
        spline_init_scale: float = 0.1,
    ) -> None:
        super().__init__()
        hidden = expansion * dim
        options = KANOptions(
            grid_size=grid_size,
            spline_order=spline_order,
            grid_range=tuple(grid_range),
            squash=squash,
            backend=backend,
            groups=groups,
            base_init_scale=base_init_scale,
            spline_init_scale=spline_init_scale,
        )
        self.up = nn.Linear(dim, hidden, bias=bias)
        self.activation = KANLayer(hidden, hidden, options)
        self.down = nn.Linear(hidden, dim, bias=bias)
        if zero_init_output:
            zero_linear_(self.down)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.activation(self.up(x)))
