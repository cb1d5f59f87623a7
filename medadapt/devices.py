"""Device checks: a device this machine lacks is one clear :class:`~medadapt.errors.ModelLoadError`, not
torch's ``AssertionError: Torch not compiled with CUDA enabled`` at the first tensor move."""

from __future__ import annotations

from medadapt.errors import ModelLoadError

__all__ = ["check_device"]


def check_device(device) -> None:
    """Refuse a device this machine does not have; ``None`` (auto) passes."""
    if device is None:
        return
    import torch

    text = str(device).strip()
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError, TypeError):
        raise ModelLoadError(f"unknown device {text!r} (expected cpu, cuda, cuda:N or mps)") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {text!r}: CUDA is not available on this machine (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {text!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
        return
    if dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise ModelLoadError(f"device {text!r}: MPS (Apple GPU) is not available on this machine "
                                 "(use --device cpu)")
        return
    backend = getattr(torch, dev.type, None) if dev.type in ("xpu", "npu", "hpu") else None
    available = getattr(backend, "is_available", None)
    if callable(available):
        if not available():
            raise ModelLoadError(f"device {text!r}: {dev.type.upper()} is not available on this machine")
        return
    raise ModelLoadError(f"unsupported device {text!r} (expected cpu, cuda, cuda:N or mps)")
