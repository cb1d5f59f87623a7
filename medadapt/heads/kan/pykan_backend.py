"""pykan's reference ``KANLayer`` behind the interface of :class:`~medadapt.heads.kan.edges.BSplineEdges`.

pykan materialises ``batch x in x out`` edge values (seconds per step at 384 -> 1536), so it is only a
reference / cross-check backend. pykan is an optional extra (``pip install medadapt[kan]``) and is imported
lazily, only when this backend is selected.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["PykanEdges"]


def _import_pykan_layer() -> type[nn.Module]:
    try:
        from kan.KANLayer import KANLayer
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            'KAN backend "pykan" needs the optional extra: pip install "medadapt[kan]"'
        ) from error
    return KANLayer


class PykanEdges(nn.Module):
    """Wraps ``kan.KANLayer`` (fully connected only); returns just its output tensor."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        grid_size: int,
        spline_order: int,
        grid_range: tuple[float, float],
        zero_init: bool,
    ) -> None:
        super().__init__()
        layer_cls = _import_pykan_layer()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.layer = layer_cls(
            in_dim=in_dim,
            out_dim=out_dim,
            num=grid_size,
            k=spline_order,
            grid_range=list(grid_range),
            save_plot_data=False,
        )
        if zero_init:
            with torch.no_grad():
                self.layer.coef.zero_()
                self.layer.scale_base.zero_()

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)[0]
