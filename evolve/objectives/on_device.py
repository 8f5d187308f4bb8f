"""Evaluators on a torch device (``Config.device``; ``evolve.kernels.gpu``): the same
rows, bit for bit, as the Numba kernels' evaluators (``evolve.objectives.tokens``,
``evolve.objectives.speculative.array_evaluator``).

A split's columns go to the device once per run (cached on its kernel arrays); a
minibatch (``--batch-blocks``) is a gather on the device. The champion's metrics and a
run's reports stay on the Numba kernels (a few programs, the same numbers). Out of
device memory is a one-line ``evolve.kernels.gpu.DeviceError``.
"""

from __future__ import annotations

from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.base import Evaluator
from evolve.kernels import fixed, gpu
from evolve.objectives.speculative import ArraySplit


def token_evaluator(arrays, name: str, device: str) -> Evaluator:
    """The evaluator of a token split (``kernels.tokens.SplitArrays``) on ``device``."""
    dev = gpu.torch_device(device)
    from evolve.kernels.gpu import tokens  # lazy: torch, only on the device path
    return Evaluator(name, gpu.guarded(lambda progs: tokens.population_counts(progs, arrays,
                                                                               dev), device),
                     arrays, arrays.n)


def trace_evaluator(split, name: str, device: str, tail_cap: float = TAIL_OFF) -> Evaluator:
    """The evaluator of a trace split held in this process (``speculative.ArraySplit``)
    on ``device``; the sums of ``with_kl=False``."""
    if not isinstance(split, ArraySplit):
        raise gpu.DeviceError.of("device", f"{device!r} scores traces held in memory; "
                                 "sharded traces are scored on cpu (or on a cluster)")
    dev = gpu.torch_device(device)
    return _evaluator(split.spec_arrays(), name, dev, device, tail_cap, None)


def _evaluator(sa, name, dev, device, tail_cap, blocks) -> Evaluator:
    from evolve.kernels.gpu import traces  # lazy: torch, only on the device path

    def kernel(progs):
        return fixed.to_float(traces.population_sums(progs, sa, dev, False, tail_cap, blocks))
    shape = sa if blocks is None else traces.Shape(sa.g, sa.k, len(blocks))
    return Evaluator(name, gpu.guarded(kernel, device), shape, shape.n * sa.k,
                     batch=lambda b: _evaluator(sa, f"{name} batch", dev, device, tail_cap, b))
