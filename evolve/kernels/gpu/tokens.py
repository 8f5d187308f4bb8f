"""The token kernel in torch: ``evolve.kernels.tokens.population_counts``, bit for bit.

A split's columns, and plog, pexp and psqrt of its inputs (as the Numba kernel's
``SplitArrays.derived``), are put on the device once (``device_split``, cached on
the ``SplitArrays``); a population is scored program by program, over row chunks that
fit the memory budget (``evolve.kernels.gpu.memory_budget``; ``chunk_rows`` forces a
size), with the tally of ``kernels.tokens._tally``: integer counts and the expected
sums in fixed point (``layout.EXPECTED_SCALE``), exact and order-free, so any
chunking gives the same integers.
"""

from __future__ import annotations

import numpy as np
import torch

from evolve.kernels import gpu
from evolve.kernels.gpu import interp
from evolve.kernels.layout import EXPECTED_SCALE
from evolve.kernels.tokens import _check_inputs


class DeviceTokens:
    """A token split's kernel columns on one torch device."""

    def __init__(self, arrays, dev):
        self.n = arrays.n
        self.X = torch.as_tensor(np.ascontiguousarray(arrays.X, dtype=np.float64), device=dev)
        self.rand = torch.as_tensor(arrays.rand, device=dev)
        self.base = torch.as_tensor(arrays.base, device=dev)
        self.std_q = torch.as_tensor(np.asarray(arrays.std_q, dtype=np.int64), device=dev)
        self.U = interp.derived(self.X)     # plog, pexp, psqrt of the inputs, once
        self.device = dev


def device_split(arrays, dev) -> DeviceTokens:
    """The columns of ``arrays`` (a ``kernels.tokens.SplitArrays``) on ``dev``, made once."""
    cache = arrays.__dict__.setdefault("_torch", {})
    key = str(dev)
    if key not in cache:
        cache[key] = DeviceTokens(arrays, dev)
    return cache[key]


def tally(h: torch.Tensor, rand, base, std_q) -> torch.Tensor:
    """The six counts of thresholds h (``kernels.tokens._tally``), int64 (6,) on the device."""
    a = rand < h
    q = torch.where(h > 0.0, torch.where(h > 1.0, 1.0, h), 0.0)
    qi = (q * EXPECTED_SCALE).to(torch.int64)
    d = qi - std_q
    zero = torch.zeros((), dtype=torch.int64, device=h.device)
    return torch.stack([a.sum(), (a & ~base).sum(), (base & ~a).sum(), qi.sum(),
                        torch.where(d > 0, d, zero).sum(), torch.where(d < 0, -d, zero).sum()])


def chunk_size(programs, dev, chunk_rows: int | None) -> int:
    """Rows per chunk: ``chunk_rows`` when given, else what the memory budget holds
    (a program's stack and the temporaries of its widest primitive, per row)."""
    if chunk_rows is not None:
        return max(1, int(chunk_rows))
    return max(1024, gpu.memory_budget(dev) // (8 * (int(programs.max_stack) + 32)))


def population_counts(programs, arrays, dev, chunk_rows: int | None = None) -> np.ndarray:
    """Counts for every program, int64 (P, 6), as ``kernels.tokens.population_counts``."""
    _check_inputs(programs, arrays)
    out = np.zeros((len(programs), 6), dtype=np.int64)
    if not len(programs):
        return out
    ds = device_split(arrays, dev)
    step = chunk_size(programs, dev, chunk_rows)
    acc = torch.zeros((len(programs), 6), dtype=torch.int64, device=dev)
    for r0 in range(0, ds.n, step):
        r1 = min(ds.n, r0 + step)
        X, U = ds.X[:, r0:r1], ds.U[:, r0:r1]
        rand, base, std_q = ds.rand[r0:r1], ds.base[r0:r1], ds.std_q[r0:r1]
        for p, (ops, consts) in enumerate(interp.program_lists(programs)):
            acc[p] += tally(interp.run(ops, consts, X, U), rand, base, std_q)
    out[:] = acc.cpu().numpy()
    return out


def population_thresholds(programs, arrays, dev) -> np.ndarray:
    """Every program's thresholds, float64 (P, n), as ``kernels.tokens.population_thresholds``."""
    _check_inputs(programs, arrays)
    ds = device_split(arrays, dev)
    out = torch.empty((len(programs), ds.n), dtype=torch.float64, device=dev)
    for p, (ops, consts) in enumerate(interp.program_lists(programs)):
        out[p] = interp.run(ops, consts, ds.X, ds.U)
    return out.cpu().numpy()
