"""Rules scored by the trace kernel on a device: the Numba kernel (``device="cpu"``,
``evolve.kernels.speculative``) or the torch kernel (``"cuda"``,
``evolve.kernels.gpu.traces``). Both give the same 128-bit sums, KL included, so the
same ``spec.Objectives`` bit for bit; ``evolve.rules.tuning`` and
``evolve.rules.headroom`` score every kernel evaluation through ``results``.
"""

from __future__ import annotations

from evolve.objectives import placement, spec


def results(programs, sa: spec.TraceArrays, with_kl: bool = True, device: str = "cpu") -> list:
    """``spec.Objectives`` of every program of ``programs`` on ``sa``, from the kernel
    sums computed on ``device`` (``evolve.objectives.placement.trace_sums``)."""
    from evolve.kernels import fixed  # lazy: Numba, only when scoring
    sums = placement.trace_sums(programs, sa, with_kl, device=device)
    return [spec.objectives_from_sums(row, sa.n_blocks, sa.g) for row in fixed.to_float(sums)]
