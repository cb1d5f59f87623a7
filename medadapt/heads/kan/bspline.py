"""B-spline basis evaluation on a uniform knot vector.

Hand-written because the only library implementation at hand, ``kan.spline.B_batch`` from pykan, is an
optional dependency and evaluates the full Cox–de Boor recursion over every knot interval with one knot row
per input feature, which dominates the cost of a KAN layer (about 10x the matmul at 1536 inputs on CPU).

* :func:`uniform_bspline_basis` (used by the layers): for uniform knots, only ``k + 1`` basis functions are
  non-zero in each knot interval and they are fixed polynomials of the local coordinate ``t`` (the matrix
  form ``[1, t, ..., t^k] @ M``, :func:`local_bspline_matrix`). The ``k + 1`` values come from ``k`` Horner
  steps and are scattered straight into the dense ``(..., n_basis)`` layout that the layer matmul needs.
* :func:`bspline_basis`: the textbook global Cox–de Boor recursion for any increasing knot vector, kept as
  a readable reference that the fast version is tested against.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import Tensor

from medadapt.errors import ConfigError

__all__ = ["uniform_knots", "local_bspline_matrix", "uniform_bspline_basis", "bspline_basis"]


def uniform_knots(grid_size: int, spline_order: int, grid_range: tuple[float, float]) -> Tensor:
    """Knot vector of ``grid_size`` equal intervals over ``grid_range``, extended by ``spline_order`` knots
    on both sides (same layout as pykan's ``extend_grid``). Length ``grid_size + 2 * spline_order + 1``."""
    low, high = grid_range
    if not high > low:
        raise ConfigError(f"grid_range must be increasing, got {grid_range}")
    step = (high - low) / grid_size
    index = torch.arange(-spline_order, grid_size + spline_order + 1, dtype=torch.float64)
    return (low + index * step).to(torch.get_default_dtype())


@lru_cache(maxsize=None)
def local_bspline_matrix(spline_order: int) -> Tensor:
    """``(k + 1, k + 1)`` matrix ``M`` with ``[1, t, ..., t^k] @ M`` = the ``k + 1`` non-zero uniform B-spline
    values at local coordinate ``t`` in ``[0, 1)`` of a knot interval (the classic matrix form of uniform
    B-splines; column ``r`` belongs to the basis function starting ``k - r`` intervals to the left).

    Built exactly by running the local Cox–de Boor recursion (The NURBS Book, A2.2) on polynomial
    coefficient vectors; for uniform knots every denominator equals the current degree.
    """
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


def uniform_bspline_basis(
    x: Tensor, first_knot: float, step: float, n_knots: int, spline_order: int
) -> Tensor:
    """All ``n_knots - 1 - spline_order`` B-spline basis values at ``x`` for the uniform knot vector
    ``first_knot + step * arange(n_knots)``. Differentiable in ``x``; zero outside the knot span.

    Returns a tensor of shape ``(*x.shape, n_knots - 1 - spline_order)``.
    """
    k = spline_order
    n_basis = n_knots - 1 - k
    u = (x - first_knot) / step
    cell = torch.floor(u).detach()
    t = (u - cell).unsqueeze(-1)
    matrix = local_bspline_matrix(k).to(device=x.device, dtype=x.dtype)
    local = matrix[k].expand(*t.shape[:-1], k + 1)
    for power in range(k - 1, -1, -1):  # Horner: [1, t, ..., t^k] @ M without computing powers
        local = torch.addcmul(matrix[power], local, t)
    # Column r of `local` belongs to global basis index cell - k + r. Indices outside [0, n_basis) (inputs
    # near or beyond the ends of the knot span) carry no basis function: clamp them and zero their values;
    # scatter_add makes the resulting duplicate indices harmless.
    index = cell.long().unsqueeze(-1) + torch.arange(-k, 1, device=x.device)
    clamped = index.clamp(0, n_basis - 1)
    local = local * (clamped == index).to(x.dtype)
    basis = torch.zeros(*x.shape, n_basis, dtype=x.dtype, device=x.device)
    return basis.scatter_add(-1, clamped, local)


def bspline_basis(x: Tensor, knots: Tensor, spline_order: int) -> Tensor:
    """Reference global Cox–de Boor recursion for any increasing 1-D ``knots``.

    Returns shape ``(*x.shape, len(knots) - 1 - spline_order)``; slow (every interval at every degree).
    """
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
