"""The token kernel on a device: ``evolve.kernels.tokens.population_counts``, bit for bit,
by the fused Triton kernels (``evolve.kernels.gpu.fused``) or, as a fallback, in torch
(``choice.kernel_for`` chooses).

A split's columns, and plog, pexp and psqrt of its inputs (as the Numba kernel's
``TokenArrays.derived``), are the split's device columns (``device_split``, made once
and cached on the ``TokenArrays``). When they fit ``stream.RESIDENT_SHARE`` of the
memory budget they are put on the device once (resident); otherwise they stay on the
host, rows first (pinned on CUDA), and each row chunk's inputs are copied to the
device once per population, plog, pexp and psqrt computed there (``evolve.kernels.gpu.stream``).
A population is scored over row chunks that fit the memory budget (one launch of the
fused kernel per chunk, or program by program in torch)
(``evolve.kernels.gpu.memory_budget``; ``chunk_rows`` forces a size), with the tally
of ``kernels.tokens._tally``: integer counts and the expected sums in fixed point
(``layout.EXPECTED_SCALE``), exact and order-free, so any chunking, resident or
streamed, gives the same integers.
"""

from __future__ import annotations

import numpy as np
import torch

from evolve.kernels import gpu
from evolve.kernels.gpu import choice, interp, stream
from evolve.kernels.layout import EXPECTED_SCALE
from evolve.kernels.tokens import _check_inputs


class DeviceTokens:
    """A token split's kernel columns for one torch device: resident (X, U, rand, base,
    std_q on the device) or, with ``streaming``, on the host (Xt, rows first) and copied
    chunk by chunk (``chunk``); ``chunks`` counts the chunks copied."""

    def __init__(self, arrays, dev):
        self.n = arrays.n
        self.device = dev
        X = np.ascontiguousarray(arrays.X, dtype=np.float64)
        std_q = np.asarray(arrays.std_q, dtype=np.int64)
        self.n_inputs = X.shape[0]
        # X and U (plog, pexp, psqrt of each input), rand, base, std_q: bytes per row
        self.bytes_per_row = 8 * 4 * self.n_inputs + 8 + 1 + 8
        self.streaming = not stream.fits(self.bytes_per_row * self.n, dev)
        self.chunks = 0
        if self.streaming:
            self.Xt = stream.host(X.T, dev)        # rows first: a chunk is one copy
            self.rand, self.base, self.std_q = (stream.host(a, dev) for a in
                                                (arrays.rand, arrays.base, std_q))
            return
        self.X = torch.as_tensor(X, device=dev)
        self.rand = torch.as_tensor(arrays.rand, device=dev)
        self.base = torch.as_tensor(arrays.base, device=dev)
        self.std_q = torch.as_tensor(std_q, device=dev)
        self.U = interp.derived(self.X)     # plog, pexp, psqrt of the inputs, once

    def chunk(self, r0: int, r1: int) -> tuple:
        """(X, U, rand, base, std_q) of rows r0..r1 on the device: views when resident,
        else copied from the host now (U computed on the device, elementwise)."""
        if not self.streaming:
            return (self.X[:, r0:r1], self.U[:, r0:r1], self.rand[r0:r1], self.base[r0:r1],
                    self.std_q[r0:r1])
        self.chunks += 1
        X = stream.to_device(self.Xt[r0:r1], self.device).t().contiguous()
        return (X, interp.derived(X),
                *(stream.to_device(t[r0:r1], self.device)
                  for t in (self.rand, self.base, self.std_q)))


def device_split(arrays, dev) -> DeviceTokens:
    """The device columns of ``arrays`` (a ``kernels.tokens.TokenArrays``) for ``dev``,
    made once (resident or streaming, decided then)."""
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


def chunk_size(programs, dev, chunk_rows: int | None, column_bytes: int = 0) -> int:
    """Rows per chunk: ``chunk_rows`` when given, else what the memory budget holds
    (a program's stack and the temporaries of its widest primitive, per row, and
    ``column_bytes`` per row of a streamed chunk's columns)."""
    if chunk_rows is not None:
        return max(1, int(chunk_rows))
    per_row = 8 * (int(programs.max_stack) + 32) + int(column_bytes)
    return max(1024, gpu.memory_budget(dev) // per_row)


def _step(programs, ds: DeviceTokens, dev, chunk_rows) -> int:
    return chunk_size(programs, dev, chunk_rows, ds.bytes_per_row if ds.streaming else 0)


def population_counts(programs, split, *, chunk_rows: int | None = None,
                      kernel: str | None = None, device) -> np.ndarray:
    """``kernels.tokens.population_counts`` on torch device ``device`` (resolved by
    ``evolve.objectives.placement``): counts for every program, int64 (P, 6), the same
    integers; by the fused kernels or the torch ones (``choice.kernel_for``; ``kernel``
    forces one; ``chunk_rows`` forces the rows a chunk holds)."""
    arrays, dev = split, device
    _check_inputs(programs, arrays)
    out = np.zeros((len(programs), 6), dtype=np.int64)
    if not len(programs):
        return out
    ds = device_split(arrays, dev)
    step = _step(programs, ds, dev, chunk_rows)
    fused = choice.fused_for(dev, kernel)
    progs = interp.program_lists(programs) if fused is None else fused.Programs(programs, dev)
    acc = torch.zeros((len(programs), 6), dtype=torch.int64, device=dev)
    for r0 in range(0, ds.n, step):
        X, U, rand, base, std_q = ds.chunk(r0, min(ds.n, r0 + step))    # once per chunk
        if fused is not None:
            fused.token_counts(progs, X, U, rand, base, std_q, acc)
            continue
        for p, (ops, consts) in enumerate(progs):
            acc[p] += tally(interp.run(ops, consts, X, U), rand, base, std_q)
    out[:] = acc.cpu().numpy()
    return out


def population_thresholds(programs, split, *, chunk_rows: int | None = None,
                          kernel: str | None = None, device) -> np.ndarray:
    """``kernels.tokens.population_thresholds`` on torch device ``device``: every
    program's thresholds, float64 (P, n), gathered on the host chunk by chunk; kernels
    as ``population_counts``."""
    arrays, dev = split, device
    _check_inputs(programs, arrays)
    ds = device_split(arrays, dev)
    out = np.empty((len(programs), ds.n), dtype=np.float64)
    if not len(programs):
        return out
    step = _step(programs, ds, dev, chunk_rows)
    fused = choice.fused_for(dev, kernel)
    progs = interp.program_lists(programs) if fused is None else fused.Programs(programs, dev)
    for r0 in range(0, ds.n, step):
        r1 = min(ds.n, r0 + step)
        X, U = ds.chunk(r0, r1)[:2]
        H = torch.empty((len(programs), r1 - r0), dtype=torch.float64, device=dev)
        if fused is not None:
            fused.token_values(progs, X, U, H)
        else:
            for p, (ops, consts) in enumerate(progs):
                H[p] = interp.run(ops, consts, X, U)
        out[:, r0:r1] = H.cpu().numpy()
    return out

