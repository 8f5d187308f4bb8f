"""Where a population is scored: the one place that reads ``Config.device``.

Objectives ask this module for an evaluator and never ask where it runs:

- ``device`` "cpu": the Numba kernels. A token split in this process; a trace split
  by its own protocol (``evolve.objectives.splits.ArraySplit`` in memory, a sharded
  split shard by shard in this process or on a Dask cluster through its backend's
  ``map_shards``, ``evolve.cluster``), so local shards and clusters are the split's
  business, not the objective's.
- any other device: the torch (or fused Triton) kernels of ``evolve.kernels.gpu``,
  through ``evolve.objectives.on_device``: the same rows, bit for bit.
- the task world's traces are scored on the CPU only (they are small; a device is
  refused in one line rather than silently not used).
"""

from __future__ import annotations

from evolve.kernels.gpu import DeviceError
from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.base import Evaluator

CPU = "cpu"


def device_of(config) -> str:
    return getattr(config, "device", CPU) or CPU


def token_evaluator(split, name: str, config=None) -> Evaluator:
    """The evaluator of a token split: its ``population_counts`` rows."""
    from evolve.kernels.tokens import TokenArrays, population_counts  # lazy: start-up
    arrays = TokenArrays(split)
    device = device_of(config)
    if device != CPU:
        from evolve.objectives import on_device    # lazy: the device path only (torch)
        return on_device.token_evaluator(arrays, name, device)
    return Evaluator(name, lambda progs: population_counts(progs, arrays), arrays, arrays.n)


def trace_evaluator(split, name: str, config=None, tail_cap: float = TAIL_OFF,
                    with_kl: bool = False) -> Evaluator:
    """The evaluator of a trace split (in memory or sharded): its trace sums."""
    from evolve.objectives.splits import as_split    # lazy: start-up (the trace schema)
    device = device_of(config)
    if device != CPU:
        from evolve.objectives import on_device    # lazy: the device path only (torch)
        return on_device.trace_evaluator(as_split(split), name, device, tail_cap, with_kl)
    return as_split(split).evaluator(name, with_kl=with_kl, tail_cap=tail_cap)


def cpu_only(config, what: str) -> None:
    """Refuse a device for data scored on the CPU only (one line naming ``device``)."""
    device = device_of(config)
    if device != CPU:
        raise DeviceError.of("device", f"{device!r}: {what} are scored on the CPU; use "
                             "device 'cpu'")
