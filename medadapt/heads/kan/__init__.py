"""Kolmogorov–Arnold network layers used by the KAN experts."""

from __future__ import annotations

from medadapt.heads.kan.bspline import bspline_basis, uniform_knots
from medadapt.heads.kan.edges import BSplineEdges
from medadapt.heads.kan.layer import KANBackend, KANLayer, KANOptions
from medadapt.heads.kan.squash import Squash, SquashKind

__all__ = [
    "BSplineEdges",
    "KANBackend",
    "KANLayer",
    "KANOptions",
    "Squash",
    "SquashKind",
    "bspline_basis",
    "uniform_knots",
]
