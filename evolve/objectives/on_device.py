"""Evaluators on a torch device (``Config.device``, resolved by
``evolve.objectives.placement``; ``evolve.kernels.gpu``): the same rows, bit for bit,
as the Numba kernels' evaluators (``evolve.objectives.tokens``,
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


def token_evaluator(arrays, name: str, *, device: gpu.Device) -> Evaluator:
    """The evaluator of a token split (``kernels.tokens.TokenArrays``) on ``device``
    (resolved by ``placement``)."""
    from evolve.kernels.gpu import tokens  # lazy: torch, only on the device path
    return Evaluator(name, device.guarded(lambda progs: tokens.population_counts(
        progs, arrays, device=device.torch)), arrays, arrays.n)


def trace_evaluator(split, name: str, tail_cap: float = TAIL_OFF, with_kl: bool = False, *,
                    device: gpu.Device) -> Evaluator:
    """The evaluator of a trace split on ``device`` (resolved by ``placement``), the sums of
    ``with_kl``: a split held in this process (``splits.ArraySplit``) or a sharded one
    whose shards are loaded in this process (``ClusterSplit`` with in-process shards)."""
    if isinstance(split, ArraySplit):
        return _evaluator(split.spec_arrays(), name, device, tail_cap, None, with_kl)
    local = getattr(split, "local_arrays", None)
    if local is None:
        raise gpu.DeviceError.of("device", f"{device.name!r} scores trace splits in memory or "
                                 f"sharded, not a {type(split).__name__}")
    sas = local()
    if sas is None:
        raise gpu.DeviceError.of("device", f"{device.name!r} scores sharded traces in this "
                                 "process; on a Dask cluster its workers score them on "
                                 "'cpu' (use device 'cpu' with a cluster)")
    return _sharded(split, Shards(sas, device.torch), name, device, tail_cap, None, with_kl)


def _evaluator(sa, name, device, tail_cap, blocks, with_kl=False) -> Evaluator:
    from evolve.kernels.gpu import traces  # lazy: torch, only on the device path

    def kernel(progs):
        return fixed.to_float(traces.population_sums(progs, sa, with_kl, tail_cap, blocks,
                                                     device=device.torch))
    shape = sa if blocks is None else traces.Shape(sa.g, sa.k, len(blocks), sa.missing)
    return Evaluator(name, device.guarded(kernel), shape, shape.n * sa.k,
                     batch=lambda b: _evaluator(sa, f"{name} batch", device, tail_cap, b,
                                                with_kl))


class Shards:
    """A sharded split's shards on one device (``sas``: each shard's TraceArrays): every
    shard resident, or every shard streamed when the whole split's columns do not fit
    (decided at the first evaluation, as an in-memory split's; ``streaming``)."""

    def __init__(self, sas, dev):
        self.sas, self.dev, self.streaming = sas, dev, None

    def sums(self, progs, with_kl: bool = True, tail_cap: float = TAIL_OFF,
             blocks=None) -> np.ndarray:
        """Exact sums of every program over every shard (or the blocks ``blocks``), the
        arguments of the trace kernel's."""
        from evolve.kernels.gpu import stream, traces  # lazy: torch, only on the device path
        if self.streaming is None:
            need = sum(traces.column_bytes(sa) for sa in self.sas)
            self.streaming = not stream.fits(need, self.dev)
        parts = []
        for sa, b in zip(self.sas, local_blocks([sa.n_blocks for sa in self.sas], blocks)):
            if b is None or b.size:
                traces.device_split(sa, self.dev, self.streaming)     # made once, cached
                parts.append(traces.population_sums(progs, sa, with_kl, tail_cap, b,
                                                    device=self.dev))
        if not parts:
            return np.zeros((len(progs), layout.width(self.sas[0].g), 2), dtype=np.int64)
        return fixed.total(parts)


def _sharded(split, shards: Shards, name, device, tail_cap, blocks, with_kl=False) -> Evaluator:
    def kernel(progs):
        return fixed.to_float(shards.sums(progs, with_kl, tail_cap, blocks))
    cpu = split.evaluator(name, blocks, with_kl, tail_cap)   # its shape: what the engine reads
    return Evaluator(name, device.guarded(kernel), cpu.arrays, cpu.rows_per_program,
                     batch=lambda b: _sharded(split, shards, f"{name} batch", device, tail_cap,
                                              b, with_kl))
