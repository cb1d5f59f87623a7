"""A KAN layer: squash inputs into the spline grid, then apply learnable edge functions.

Two interchangeable backends compute the same function (verified in ``tests/test_heads.py``):

* ``"fast"`` (default): :class:`~medadapt.heads.kan.edges.BSplineEdges`, basis-then-matmul, supports
  block-diagonal ``groups``.
* ``"pykan"``: :class:`~medadapt.heads.kan.pykan_backend.PykanEdges`, pykan's own layer (optional extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.heads.kan.edges import BSplineEdges
from medadapt.heads.kan.pykan_backend import PykanEdges
from medadapt.heads.kan.squash import Squash, SquashKind

__all__ = ["KANBackend", "KANOptions", "KANLayer"]

KANBackend = Literal["fast", "pykan"]


@dataclass(frozen=True)
class KANOptions:
    """Hyper-parameters shared by every KAN layer of an expert.

    Attributes:
        grid_size: number of spline grid intervals ``G`` (pykan's ``num``).
        spline_order: spline degree ``k`` (pykan's ``k``).
        grid_range: interval of the grid; inputs are squashed into it.
        squash: how inputs are brought into the grid (see :mod:`medadapt.heads.kan.squash`).
        backend: ``"fast"`` or ``"pykan"``.
        groups: block-diagonal connectivity, ``"fast"`` backend only.
        base_init_scale: initial scale of the SiLU-branch weights.
        spline_init_scale: initial scale of the spline coefficients.
    """

    grid_size: int = 5
    spline_order: int = 3
    grid_range: tuple[float, float] = (-1.0, 1.0)
    squash: SquashKind = "layernorm_tanh"
    backend: KANBackend = "fast"
    groups: int = 1
    base_init_scale: float = 1.0
    spline_init_scale: float = 0.1

    def __post_init__(self) -> None:
        if self.backend not in get_args(KANBackend):
            raise ConfigError(f"Unknown KAN backend {self.backend!r}; valid: {list(get_args(KANBackend))}")
        if self.backend == "pykan" and self.groups != 1:
            raise ConfigError('KAN backend "pykan" only supports groups=1')
        if self.grid_size < 1 or self.spline_order < 0:
            raise ConfigError("grid_size must be >= 1 and spline_order >= 0")
        object.__setattr__(self, "grid_range", (float(self.grid_range[0]), float(self.grid_range[1])))


class KANLayer(nn.Module):
    """``in_dim -> out_dim`` KAN layer on inputs of shape ``(..., in_dim)``.

    Args:
        in_dim, out_dim: widths.
        options: :class:`KANOptions`.
        zero_init: start with an identically-zero output (used for the last layer of an expert).
    """

    def __init__(self, in_dim: int, out_dim: int, options: KANOptions, zero_init: bool = False) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.squash = Squash(in_dim, options.squash, options.grid_range)
        if options.backend == "fast":
            self.edges: nn.Module = BSplineEdges(
                in_dim,
                out_dim,
                grid_size=options.grid_size,
                spline_order=options.spline_order,
                grid_range=options.grid_range,
                groups=options.groups,
                base_init_scale=options.base_init_scale,
                spline_init_scale=options.spline_init_scale,
                zero_init=zero_init,
            )
        else:
            self.edges = PykanEdges(
                in_dim,
                out_dim,
                grid_size=options.grid_size,
                spline_order=options.spline_order,
                grid_range=options.grid_range,
                zero_init=zero_init,
            )

    def forward(self, x: Tensor) -> Tensor:
        leading = x.shape[:-1]
        out = self.edges(self.squash(x.reshape(-1, self.in_dim)))
        return out.reshape(*leading, self.out_dim)
