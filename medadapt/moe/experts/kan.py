"""KAN expert (paper §III-B): two KAN layers ``h -> expansion*h -> h``.

Each layer has learnable B-spline edge functions plus pykan's usual SiLU base branch; inputs of each layer
are squashed into the spline grid (default: non-affine LayerNorm then tanh, see
:mod:`medadapt.heads.kan.squash`).
"""

from __future__ import annotations

from torch import Tensor, nn

from medadapt.moe.experts.registry import register_expert
from medadapt.heads.kan import KANBackend, KANLayer, KANOptions, SquashKind

__all__ = ["KANExpert"]


@register_expert("kan")
class KANExpert(nn.Module):
    """``KAN(h, e*h) -> KAN(e*h, h)``.

    Args:
        dim: embedding width ``h``.
        expansion: hidden width multiplier ``e`` (paper: 4).
        zero_init_output: zero the last KAN layer so the expert starts as the zero function.
        grid_size, spline_order, grid_range, squash, backend, groups, base_init_scale, spline_init_scale:
            see :class:`~medadapt.heads.kan.KANOptions`.
    """

    def __init__(
        self,
        dim: int,
        expansion: int = 4,
        zero_init_output: bool = True,
        grid_size: int = 5,
        spline_order: int = 3,
        grid_range: tuple[float, float] = (-1.0, 1.0),
        squash: SquashKind = "layernorm_tanh",
        backend: KANBackend = "fast",
        groups: int = 1,
        base_init_scale: float = 1.0,
        spline_init_scale: float = 0.1,
    ) -> None:
        super().__init__()
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
        self.up = KANLayer(dim, expansion * dim, options)
        self.down = KANLayer(expansion * dim, dim, options, zero_init=zero_init_output)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.up(x))
