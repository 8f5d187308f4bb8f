"""Which kernels score populations on a torch device: the fused Triton interpreter
(``evolve.kernels.gpu.fused``) or the torch fallback (``evolve.kernels.gpu.interp``).

Chosen once per process and device (``kernel_for``): "fused" on a CUDA device where
Triton imports and the compiled kernels pass ``fused.probe``, else "torch";
``EVOLVE_GPU_KERNEL`` (``evolve.kernels.gpu.KERNEL``) forces either. Apart from
``evolve.kernels.gpu`` (the device), so that the fused kernels, which read the device's
memory budget and errors there, are not imported by the package they belong to.
"""

from __future__ import annotations

import os
import sys
import warnings

from evolve.kernels.gpu import KERNEL, KERNELS, DeviceError, forced_kernel

_READY: dict = {}       # str(torch device) -> whether the fused kernels passed their probe


def kernel_for(dev) -> str:
    """Which kernels score populations on torch device ``dev``: "fused" (Triton,
    ``evolve.kernels.gpu.fused``) on a CUDA device where Triton imports and the compiled
    kernels pass ``fused.probe`` (checked once per process and device; a failed probe
    is one warning, and the torch kernels score), else "torch". ``EVOLVE_GPU_KERNEL``
    forces either; forced "fused" without Triton is a one-line DeviceError."""
    forced = forced_kernel()
    if forced == "torch":
        return "torch"
    if forced == "fused":
        _fused(dev)
        return "fused"
    if dev.type != "cuda":
        return "torch"
    key = str(dev)
    if key not in _READY:
        _READY[key] = _probe(dev)
    return "fused" if _READY[key] else "torch"


def fused_for(dev, kernel: str | None = None):
    """The module of the fused kernels (``evolve.kernels.gpu.fused``) when they score on
    torch device ``dev`` (``kernel_for``, or ``kernel``: "fused" or "torch"), else None."""
    if kernel not in (None,) + KERNELS:
        raise ValueError(f"kernel: {kernel!r} is invalid; expected one of {', '.join(KERNELS)}")
    return _fused(dev) if (kernel or kernel_for(dev)) == "fused" else None


def _fused(dev):
    """The module of the fused kernels; on a device other than CUDA in Triton's
    interpreter, switched on here when Triton is not yet imported (Triton decides it
    for every function, its own included, when it is imported)."""
    if dev.type != "cuda" and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from evolve.kernels.gpu import fused  # lazy: triton, only where the fused kernels run
    except ImportError as e:
        raise DeviceError.of("device", f"'cuda' with {KERNEL}=fused needs triton ({e}; pip "
                             f"install triton), or set {KERNEL}=torch") from None
    if dev.type != "cuda" and not fused.interpreted():
        raise DeviceError.of("device", f"the fused kernels run on torch device {dev.type!r} "
                             "only in Triton's interpreter: set TRITON_INTERPRET=1 before "
                             "Triton is imported")
    return fused


def _probe(dev) -> bool:
    try:
        from evolve.kernels.gpu import fused  # lazy: triton, only on a CUDA device
    except ImportError:
        return False                            # no Triton: the torch kernels, silently
    if fused.interpreted():
        return False                            # TRITON_INTERPRET=1: far slower than torch
    why = fused.probe(dev)
    if why:
        warnings.warn(f"device 'cuda': {why}; populations are scored by the torch kernels",
                      RuntimeWarning, stacklevel=2)
    return not why
