"""Learnable KAN edge functions, evaluated as "B-spline basis, then one matmul".

Each edge ``i -> j`` carries ``phi_ij(x) = w_base[i, j] * silu(x) + sum_b w_spline[i, b, j] * B_b(x)``, and
output ``j`` sums its incoming edges. Rather than materialising the ``batch x in x out`` tensor of edge values
(what pykan's ``KANLayer`` does), the basis ``batch x in x n_basis`` is computed once and contracted with the
coefficient matrix ``(in * n_basis) x out`` in a single matmul; the SiLU branch is a second, ordinary matmul.

Hand-written because no installed library provides this formulation (pykan only has the materialising one).

``groups > 1`` gives a block-diagonal KAN: inputs and outputs are split into ``groups`` equal blocks and
block ``g`` of the outputs only sees block ``g`` of the inputs (like a grouped convolution), dividing the
parameter count and FLOPs by ``groups``.

Compared with pykan, the per-edge spline scale ``scale_sp`` and the pruning ``mask`` are folded into the
coefficients (``w_spline = coef * scale_sp * mask``; ``w_base = scale_base * mask``); they are redundant
for gradient training. :meth:`BSplineEdges.copy_from_pykan` performs this folding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError
from medadapt.heads.kan.bspline import uniform_bspline_basis, uniform_knots

__all__ = ["BSplineEdges"]


class BSplineEdges(nn.Module):
    """Fast KAN edge functions (see module docstring).

    Args:
        in_dim, out_dim: layer widths; both must be divisible by ``groups``.
        grid_size: number of grid intervals ``G``.
        spline_order: spline degree ``k``; there are ``G + k`` basis functions per input.
        grid_range: interval covered by the (non-extended) grid.
        groups: block-diagonal connectivity (1 = fully connected KAN).
        base_init_scale: SiLU-branch weights start ~ U(-s, s) / sqrt(in_per_group) (pykan's
            ``scale_base_sigma``).
        spline_init_scale: spline coefficients start ~ N(0, s^2) / sqrt(in_per_group * n_basis).
        zero_init: start with all weights zero, i.e. the layer outputs exactly 0.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        grid_size: int,
        spline_order: int,
        grid_range: tuple[float, float],
        groups: int,
        base_init_scale: float,
        spline_init_scale: float,
        zero_init: bool,
    ) -> None:
        super().__init__()
        if groups < 1 or in_dim % groups or out_dim % groups:
            raise ConfigError(f"groups={groups} must divide in_dim={in_dim} and out_dim={out_dim}")
        self.in_dim, self.out_dim, self.groups = in_dim, out_dim, groups
        self.spline_order = spline_order
        knots = uniform_knots(grid_size, spline_order, grid_range)
        # Derived from the config, so not saved with the weights.
        self.register_buffer("knots", knots, persistent=False)
        self.first_knot = float(knots[0])
        self.knot_step = (grid_range[1] - grid_range[0]) / grid_size
        self.n_basis = grid_size + spline_order
        in_g, out_g = in_dim // groups, out_dim // groups
        self.base_weight = nn.Parameter(torch.empty(groups, in_g, out_g))
        self.spline_weight = nn.Parameter(torch.empty(groups, in_g * self.n_basis, out_g))
        if zero_init:
            nn.init.zeros_(self.base_weight)
            nn.init.zeros_(self.spline_weight)
        else:
            with torch.no_grad():
                self.base_weight.uniform_(-base_init_scale, base_init_scale).div_(math.sqrt(in_g))
                self.spline_weight.normal_(0.0, spline_init_scale / math.sqrt(in_g * self.n_basis))

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``(N, in_dim)`` already inside the grid range -> ``(N, out_dim)``."""
        n = x.shape[0]
        basis = uniform_bspline_basis(
            x, self.first_knot, self.knot_step, self.knots.numel(), self.spline_order
        )  # (N, in, n_basis)
        if self.groups == 1:
            spline = basis.reshape(n, -1) @ self.spline_weight[0]
            base = F.silu(x) @ self.base_weight[0]
        else:
            basis = basis.reshape(n, self.groups, -1)
            spline = torch.einsum("ngk,gko->ngo", basis, self.spline_weight).reshape(n, self.out_dim)
            base = torch.einsum("ngi,gio->ngo", F.silu(x).reshape(n, self.groups, -1), self.base_weight)
            base = base.reshape(n, self.out_dim)
        return base + spline

    @torch.no_grad()
    def copy_from_pykan(self, layer: nn.Module) -> None:
        """Load the function computed by a pykan ``KANLayer`` (same sizes, uniform grid) into this layer."""
        if self.groups != 1:
            raise ValueError("copy_from_pykan needs groups=1 (pykan layers are fully connected)")
        grid = layer.grid.detach()
        if grid.shape != (self.in_dim, self.knots.numel()) or not torch.allclose(
            grid, self.knots.to(grid).expand_as(grid), atol=1e-6
        ):
            raise ValueError("pykan layer grid differs from this layer's knots (size, range, update_grid?)")
        if layer.k != self.spline_order:
            raise ValueError(f"pykan spline order {layer.k} != {self.spline_order}")
        mask = layer.mask.detach()
        coef = layer.coef.detach() * (layer.scale_sp.detach() * mask)[..., None]  # (in, out, n_basis)
        self.spline_weight.copy_(coef.permute(0, 2, 1).reshape(1, -1, self.out_dim))
        self.base_weight.copy_((layer.scale_base.detach() * mask)[None])
