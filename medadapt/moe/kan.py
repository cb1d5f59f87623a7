"""Kolmogorov-Arnold network layers for the KAN experts: squash inputs into the spline grid, then learnable
B-spline edge functions. Hand-written because pykan (an optional extra) materialises ``batch x in x out`` edge
values and runs the full Cox-de Boor recursion per input (about 10x the matmul at 1536 inputs); here the basis is
computed once in the uniform-knot matrix form and contracted with the coefficients in one matmul (``groups > 1``:
block-diagonal). pykan's own layer stays available as the ``"pykan"`` backend, a cross-check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.errors import ConfigError

__all__ = ["BSplineEdges", "KANBackend", "KANLayer", "KANOptions", "PykanEdges", "Squash", "SquashKind",
           "bspline_basis", "local_bspline_matrix", "uniform_bspline_basis", "uniform_knots"]

KANBackend = Literal["fast", "pykan"]
SquashKind = Literal["layernorm_tanh", "tanh", "none"]


def uniform_knots(grid_size: int, spline_order: int, grid_range: tuple[float, float]) -> Tensor:
    """``grid_size`` equal intervals over ``grid_range`` extended by ``spline_order`` knots on both sides
    (pykan's ``extend_grid`` layout); length ``grid_size + 2 * spline_order + 1``."""
    low, high = grid_range
    if not high > low:
        raise ConfigError(f"grid_range must be increasing, got {grid_range}")
    step = (high - low) / grid_size
    index = torch.arange(-spline_order, grid_size + spline_order + 1, dtype=torch.float64)
    return (low + index * step).to(torch.get_default_dtype())


@lru_cache(maxsize=None)
def local_bspline_matrix(spline_order: int) -> Tensor:
    """``(k + 1, k + 1)`` matrix ``M``: ``[1, t, ..., t^k] @ M`` are the ``k + 1`` non-zero uniform B-spline
    values at local coordinate ``t`` in ``[0, 1)`` (column ``r``: the basis function starting ``k - r`` intervals
    to the left). Built exactly by the local Cox-de Boor recursion (The NURBS Book, A2.2) on polynomial
    coefficients; for uniform knots every denominator is the current degree."""
    k = spline_order

    def times_linear(poly: list[float], const: float, slope: float) -> list[float]:
        out = [0.0] * (len(poly) + 1)
        for power, coef in enumerate(poly):
            out[power] += const * coef
            out[power + 1] += slope * coef
        return out

    def add(a: list[float], b: list[float]) -> list[float]:
        size = max(len(a), len(b))
        return [(a[i] if i < len(a) else 0.0) + (b[i] if i < len(b) else 0.0) for i in range(size)]

    values: list[list[float]] = [[1.0]]
    for degree in range(1, k + 1):
        updated, saved = [], [0.0]
        for r in range(degree):
            temp = [c / degree for c in values[r]]
            updated.append(add(saved, times_linear(temp, r + 1.0, -1.0)))  # right = (r + 1) - t
            saved = times_linear(temp, degree - r - 1.0, 1.0)  # left = t + degree - r - 1
        updated.append(saved)
        values = updated
    matrix = torch.zeros(k + 1, k + 1, dtype=torch.float64)
    for r, poly in enumerate(values):
        matrix[: len(poly), r] = torch.tensor(poly, dtype=torch.float64)
    return matrix


def uniform_bspline_basis(x: Tensor, first_knot: float, step: float, n_knots: int, spline_order: int) -> Tensor:
    """The ``n_knots - 1 - spline_order`` B-spline values at ``x`` for the knots ``first_knot + step *
    arange(n_knots)``, shape ``(*x.shape, n_basis)``; differentiable in ``x``, zero outside the knot span. Only
    ``k + 1`` functions are non-zero per interval: ``k`` Horner steps, scattered into the dense layout."""
    k = spline_order
    n_basis = n_knots - 1 - k
    u = (x - first_knot) / step
    cell = torch.floor(u).detach()
    t = (u - cell).unsqueeze(-1)
    matrix = local_bspline_matrix(k).to(device=x.device, dtype=x.dtype)
    local = matrix[k].expand(*t.shape[:-1], k + 1)
    for power in range(k - 1, -1, -1):  # Horner: [1, t, ..., t^k] @ M without computing powers
        local = torch.addcmul(matrix[power], local, t)
    # Column r of `local` is global basis index cell - k + r. Indices outside [0, n_basis) carry no basis
    # function: clamp them and zero their values; scatter_add makes the duplicate indices harmless.
    index = cell.long().unsqueeze(-1) + torch.arange(-k, 1, device=x.device)
    clamped = index.clamp(0, n_basis - 1)
    local = local * (clamped == index).to(x.dtype)
    basis = torch.zeros(*x.shape, n_basis, dtype=x.dtype, device=x.device)
    return basis.scatter_add(-1, clamped, local)


def bspline_basis(x: Tensor, knots: Tensor, spline_order: int) -> Tensor:
    """Reference global Cox-de Boor recursion for any increasing 1-D ``knots`` (slow; the fast version is tested
    against it). Shape ``(*x.shape, len(knots) - 1 - spline_order)``."""
    x = x.unsqueeze(-1)
    knots = knots.to(dtype=x.dtype, device=x.device)
    basis = ((x >= knots[:-1]) & (x < knots[1:])).to(x.dtype)
    for degree in range(1, spline_order + 1):
        left_den = knots[degree:-1] - knots[: -(degree + 1)]
        right_den = knots[degree + 1 :] - knots[1:-degree]
        left = (x - knots[: -(degree + 1)]) / left_den * basis[..., :-1]
        right = (knots[degree + 1 :] - x) / right_den * basis[..., 1:]
        basis = left + right
    return basis


class Squash(nn.Module):
    """Map features into ``grid_range``, where the splines live: ``layernorm_tanh`` (non-affine LayerNorm, then
    tanh: robust to backbones whose raw embeddings have very different norms), ``tanh`` (keeps relative scale) or
    ``none`` (the caller guarantees the range)."""

    def __init__(self, dim: int, kind: SquashKind, grid_range: tuple[float, float]) -> None:
        super().__init__()
        if kind not in get_args(SquashKind):
            raise ConfigError(f"Unknown squash {kind!r}; valid: {list(get_args(SquashKind))}")
        self.kind = kind
        self.norm = nn.LayerNorm(dim, elementwise_affine=False) if kind == "layernorm_tanh" else None
        low, high = grid_range
        self.center = (high + low) / 2.0
        self.half_width = (high - low) / 2.0

    def forward(self, x: Tensor) -> Tensor:
        if self.kind == "none":
            return x
        if self.norm is not None:
            x = self.norm(x)
        return self.center + self.half_width * torch.tanh(x)


class BSplineEdges(nn.Module):
    """Edge ``i -> j``: ``w_base[i, j] * silu(x) + sum_b w_spline[i, b, j] * B_b(x)``; output ``j`` sums them.
    pykan's ``scale_sp`` and ``mask`` are folded into the weights (:meth:`copy_from_pykan`); ``zero_init``: the
    layer outputs exactly 0, else pykan-like scaled uniform / normal init (``base_init_scale``, ``spline_init_scale``)."""

    def __init__(self, in_dim: int, out_dim: int, grid_size: int, spline_order: int,
                 grid_range: tuple[float, float], groups: int, base_init_scale: float, spline_init_scale: float,
                 zero_init: bool) -> None:
        super().__init__()
        if groups < 1 or in_dim % groups or out_dim % groups:
            raise ConfigError(f"groups={groups} must divide in_dim={in_dim} and out_dim={out_dim}")
        self.in_dim, self.out_dim, self.groups = in_dim, out_dim, groups
        self.spline_order = spline_order
        knots = uniform_knots(grid_size, spline_order, grid_range)
        self.register_buffer("knots", knots, persistent=False)  # derived from the config: not saved
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
        """``x``: ``(N, in_dim)`` inside the grid range -> ``(N, out_dim)``."""
        n = x.shape[0]
        basis = uniform_bspline_basis(x, self.first_knot, self.knot_step, self.knots.numel(), self.spline_order)
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


class PykanEdges(nn.Module):
    """pykan's ``KANLayer`` (fully connected; seconds per step at 384 -> 1536) returning just its output; the
    optional extra ``pip install medadapt[kan]``, imported only when this backend is chosen."""

    def __init__(self, in_dim: int, out_dim: int, grid_size: int, spline_order: int,
                 grid_range: tuple[float, float], zero_init: bool) -> None:
        super().__init__()
        try:
            from kan.KANLayer import KANLayer as PykanLayer
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError('KAN backend "pykan" needs the optional extra: pip install "medadapt[kan]"') \
                from error
        self.in_dim, self.out_dim = in_dim, out_dim
        self.layer = PykanLayer(in_dim=in_dim, out_dim=out_dim, num=grid_size, k=spline_order,
                                grid_range=list(grid_range), save_plot_data=False)
        if zero_init:
            with torch.no_grad():
                self.layer.coef.zero_()
                self.layer.scale_base.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)[0]


@dataclass(frozen=True)
class KANOptions:
    """Hyper-parameters of an expert's KAN layers: grid (pykan's ``num``, ``k``, range), how inputs are squashed
    into it, ``backend``, block-diagonal ``groups`` (``fast`` only) and the initial weight scales."""

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
    """``in_dim -> out_dim`` KAN layer on ``(..., in_dim)``; ``zero_init``: an identically-zero output (the last
    layer of an expert)."""

    def __init__(self, in_dim: int, out_dim: int, options: KANOptions, zero_init: bool = False) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.squash = Squash(in_dim, options.squash, options.grid_range)
        grid = {"grid_size": options.grid_size, "spline_order": options.spline_order,
                "grid_range": options.grid_range, "zero_init": zero_init}
        if options.backend == "fast":
            self.edges: nn.Module = BSplineEdges(in_dim, out_dim, groups=options.groups,
                                                 base_init_scale=options.base_init_scale,
                                                 spline_init_scale=options.spline_init_scale, **grid)
        else:
            self.edges = PykanEdges(in_dim, out_dim, **grid)

    def forward(self, x: Tensor) -> Tensor:
        leading = x.shape[:-1]
        out = self.edges(self.squash(x.reshape(-1, self.in_dim)))
        return out.reshape(*leading, self.out_dim)
