"""Rules scored by the trace kernel on a device: the Numba kernel (``device="cpu"``,
``evolve.kernels.speculative``) or the torch kernel (``"cuda"``,
``evolve.kernels.gpu.traces``). Both give the same 128-bit sums, KL included, so the
same ``spec.Objectives`` bit for bit; ``evolve.rules.tuning`` and
``evolve.rules.headroom`` score every kernel evaluation through ``results``.
"""

from __future__ import annotations

from evolve.kernels import gpu
from evolve.objectives import spec


def results(programs, sa: spec.TraceArrays, with_kl: bool = True, device: str = "cpu") -> list:
    """``spec.Objectives`` of every program of ``programs`` on ``sa``, from the kernel
    sums computed on ``device``."""
    if device == "cpu":
        return spec.population_results(programs, sa, with_kl)
    dev = gpu.torch_device(device)
    from evolve.kernels import fixed  # lazy: Numba, only when scoring
    from evolve.kernels.gpu import traces  # lazy: torch, only on the device path
    sums = gpu.guarded(traces.population_sums, device)(programs, sa, dev, with_kl)
    return [spec.objectives_from_sums(row, sa.n_blocks, sa.g) for row in fixed.to_float(sums)]
