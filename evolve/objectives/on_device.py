"""Evaluators on a torch device (``Config.device``; ``evolve.kernels.gpu``): the same
rows, bit for bit, as the Numba kernels' evaluators (``evolve.objectives.tokens``,
``evolve.objectives.splits.array_evaluator``, and a sharded split's evaluator,
``evolve.cluster.session.ClusterSplit``).

A split's columns go to the device once per run (cached on its kernel arrays) when
they fit half the memory budget, else they stay on the host and each chunk is copied
per population (``evolve.kernels.gpu.stream``); a minibatch (``--batch-blocks``) is a
gather, on the device or of a streamed chunk on the host. A sharded split held in
this process is scored shard by shard, every shard resident or every shard streamed
(as the whole split's columns fit the budget or not), and the exact sums added; a
sharded split on a Dask cluster is scored by its workers, on cpu. The champion's
metrics and a run's reports stay on the Numba kernels (a few programs, the same
numbers). Out of device memory is a one-line ``evolve.kernels.gpu.DeviceError``.
"""

from __future__ import annotations

import numpy as np

from evolve.data.shards import local_blocks
from evolve.kernels import layout
from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.base import Evaluator
from evolve.kernels import fixed, gpu
from evolve.objectives.splits import ArraySplit


def token_evaluator(arrays, name: str, device: str) -> Evaluator:
    """The evaluator of a token split (``kernels.tokens.TokenArrays``) on ``device``."""
    dev = gpu.torch_device(device)
    from evolve.kernels.gpu import tokens  # lazy: torch, only on the device path
    return Evaluator(name, gpu.guarded(lambda progs: tokens.population_counts(progs, arrays,
                                                                               dev), device),
                     arrays, arrays.n)


def trace_evaluator(split, name: str, device: str, tail_cap: float = TAIL_OFF,
                    with_kl: bool = False) -> Evaluator:
    """The evaluator of a trace split on ``device``, the sums of ``with_kl``: a
    split held in this process (``splits.ArraySplit``) or a sharded one whose
    shards are loaded in this process (``ClusterSplit`` with in-process shards)."""
    if isinstance(split, ArraySplit):
        dev = gpu.torch_device(device)
        return _evaluator(split.spec_arrays(), name, dev, device, tail_cap, None, with_kl)
    local = getattr(split, "local_arrays", None)
    if local is None:
        raise gpu.DeviceError.of("device", f"{device!r} scores trace splits in memory or "
                                 f"sharded, not a {type(split).__name__}")
    sas = local()
    if sas is None:
        raise gpu.DeviceError.of("device", f"{device!r} scores sharded traces in this "
                                 "process; on a Dask cluster its workers score them on "
                                 "'cpu' (use device 'cpu' with a cluster)")
    dev = gpu.torch_device(device)
    return _sharded(split, Shards(sas, dev), name, device, tail_cap, None, with_kl)


def _evaluator(sa, name, dev, device, tail_cap, blocks, with_kl=False) -> Evaluator:
    from evolve.kernels.gpu import traces  # lazy: torch, only on the device path

    def kernel(progs):
        return fixed.to_float(traces.population_sums(progs, sa, dev, with_kl, tail_cap,
                                                     blocks))
    shape = sa if blocks is None else traces.Shape(sa.g, sa.k, len(blocks), sa.missing)
    return Evaluator(name, gpu.guarded(kernel, device), shape, shape.n * sa.k,
                     batch=lambda b: _evaluator(sa, f"{name} batch", dev, device, tail_cap, b,
                                                with_kl))


class Shards:
    """A sharded split's shards on one device (``sas``: each shard's TraceArrays): every
    shard resident, or every shard streamed when the whole split's columns do not fit
    (decided at the first evaluation, as an in-memory split's; ``streaming``)."""

    def __init__(self, sas, dev):
        self.sas, self.dev, self.streaming = sas, dev, None

    def sums(self, progs, tail_cap: float, blocks, with_kl: bool = False) -> np.ndarray:
        """Exact sums of every program over every shard (or the blocks ``blocks``)."""
        from evolve.kernels.gpu import stream, traces  # lazy: torch, only on the device path
        if self.streaming is None:
            need = sum(traces.column_bytes(sa) for sa in self.sas)
            self.streaming = not stream.fits(need, self.dev)
        parts = []
        for sa, b in zip(self.sas, local_blocks([sa.n_blocks for sa in self.sas], blocks)):
            if b is None or b.size:
                traces.device_split(sa, self.dev, self.streaming)     # made once, cached
                parts.append(traces.population_sums(progs, sa, self.dev, with_kl, tail_cap,
                                                    b))
        if not parts:
            return np.zeros((len(progs), layout.width(self.sas[0].g), 2), dtype=np.int64)
        return fixed.total(parts)


def _sharded(split, shards: Shards, name, device, tail_cap, blocks, with_kl=False) -> Evaluator:
    def kernel(progs):
        return fixed.to_float(shards.sums(progs, tail_cap, blocks, with_kl))
    cpu = split.evaluator(name, blocks, with_kl, tail_cap)   # its shape: what the engine reads
    return Evaluator(name, gpu.guarded(kernel, device), cpu.arrays, cpu.rows_per_program,
                     batch=lambda b: _sharded(split, shards, f"{name} batch", device, tail_cap,
                                              b, with_kl))
