"""Nothing non-finite is written: the check every tensor writer runs first (adapter weights, checkpoints,
HyReC's lexical weights). A head with NaN weights would poison every model and cache namespace it touches;
training stops before that, and this covers the Python API too. Tensors are checked where they live.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from medadapt.errors import MedAdaptError

__all__ = ["check_finite_tensors", "non_finite_tensors"]


def _finite(value: Any) -> bool:
    """``value`` (a torch tensor, a numpy array, or anything else: taken as finite) holds no NaN / inf."""
    if hasattr(value, "is_floating_point") and hasattr(value, "isfinite"):  # torch
        if not (value.is_floating_point() or value.is_complex()) or value.numel() == 0:
            return True
        return bool(value.detach().isfinite().all())
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(dtype, "kind", "") in "fc" and hasattr(value, "size"):  # numpy
        import numpy as np

        return value.size == 0 or bool(np.isfinite(value).all())
    return True


def non_finite_tensors(tensors: Mapping[str, Any]) -> list[str]:
    """The names of the tensors (torch or numpy) in ``tensors`` that hold NaN or infinity, in order."""
    return [name for name, value in tensors.items() if not _finite(value)]


def check_finite_tensors(tensors: Mapping[str, Any], where: str) -> None:
    """Refuse to write ``tensors`` to ``where`` (for the message) when any holds NaN or infinity: one
    :class:`MedAdaptError` naming up to three of them."""
    bad = non_finite_tensors(tensors)
    if not bad:
        return
    names = ", ".join(bad[:3]) + (f" (and {len(bad) - 3} more)" if len(bad) > 3 else "")
    verb = "holds" if len(bad) == 1 else "hold"
    raise MedAdaptError(f"cannot write {where}: {names} {verb} NaN or infinity (weights that encode every "
                        "text to NaN); nothing was written")
