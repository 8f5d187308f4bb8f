"""Where a population is scored: the one place that reads a device's name.

Objectives, rules and reports ask this module for an evaluator or for kernel sums and
never ask where they run; the device kernels of ``evolve.kernels.gpu`` take the CPU
kernels' arguments, with the torch device last (``device=``), resolved here only
(``resolve``):

- ``device`` "cpu": the Numba kernels. A token split in this process; a trace split
  by its own protocol (``evolve.objectives.splits.ArraySplit`` in memory, a sharded
  split shard by shard in this process or on a Dask cluster through its backend's
  ``map_shards``, ``evolve.cluster``), so local shards and clusters are the split's
  business, not the objective's.
- "cuda": the fused Triton (or torch) kernels of ``evolve.kernels.gpu``, through
  ``evolve.objectives.on_device``: the same rows, bit for bit.
- the task world's traces are scored on the CPU only (they are small; a device is
  refused in one line rather than silently not used).

``trace_sums`` and ``token_counts`` are the kernels themselves behind the same choice,
for what scores rules outside a run (``evolve.rules.kernel``, the benchmark).
"""

from __future__ import annotations

from evolve.kernels import gpu
from evolve.kernels.gpu import DeviceError
from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.base import Evaluator

CPU = "cpu"
DEVICES = gpu.DEVICES


def device_of(config) -> str:
    return getattr(config, "device", CPU) or CPU


def check(device) -> None:
    """A one-line ``DeviceError`` naming ``device`` unless populations can be scored
    there (a known name; for "cuda", torch and a CUDA device): before any work."""
    resolve(device)


def resolve(device: str) -> gpu.Device | None:
    """The device that scores populations for ``device`` ("cuda": a ``gpu.Device``, its
    torch device checked, a one-line ``DeviceError`` when it cannot), None for "cpu"
    (the Numba kernels, no torch import)."""
    gpu.check_name(device)
    return None if device == CPU else gpu.resolve(device)


def token_evaluator(split, name: str, config=None) -> Evaluator:
    """The evaluator of a token split: its ``population_counts`` rows."""
    from evolve.kernels.tokens import TokenArrays, population_counts  # lazy: start-up
    arrays = TokenArrays(split)
    device = device_of(config)
    if device != CPU:
        from evolve.objectives import on_device    # lazy: the device path only (torch)
        return on_device.token_evaluator(arrays, name, device=resolve(device))
    return Evaluator(name, lambda progs: population_counts(progs, arrays), arrays, arrays.n)


def trace_evaluator(split, name: str, config=None, tail_cap: float = TAIL_OFF,
                    with_kl: bool = False) -> Evaluator:
    """The evaluator of a trace split (in memory or sharded): its trace sums."""
    from evolve.objectives.splits import as_split    # lazy: start-up (the trace schema)
    device = device_of(config)
    if device != CPU:
        from evolve.objectives import on_device    # lazy: the device path only (torch)
        return on_device.trace_evaluator(as_split(split), name, tail_cap, with_kl,
                                         device=resolve(device))
    return as_split(split).evaluator(name, with_kl=with_kl, tail_cap=tail_cap)


def trace_sums(programs, sa, with_kl: bool = True, tail_cap: float = TAIL_OFF, blocks=None,
               device: str = CPU):
    """The trace kernel's exact sums (``evolve.kernels.speculative.population_sums``) of
    ``programs`` on TraceArrays ``sa``, computed on ``device``: the same integers."""
    dev = resolve(device)
    if dev is None:
        from evolve.kernels.speculative import population_sums  # lazy: start-up (Numba)
        return population_sums(programs, sa, with_kl, tail_cap, blocks)
    from evolve.kernels.gpu import traces  # lazy: torch, only on the device path
    return dev.guarded(traces.population_sums)(programs, sa, with_kl, tail_cap, blocks,
                                               device=dev.torch)


def token_counts(programs, arrays, device: str = CPU, **sizes):
    """The token kernel's counts (``evolve.kernels.tokens.population_counts``) of
    ``programs`` on TokenArrays ``arrays``, computed on ``device`` (``sizes``: the
    device kernel's ``chunk_rows`` or ``kernel``): the same integers."""
    dev = resolve(device)
    if dev is None:
        from evolve.kernels.tokens import population_counts  # lazy: start-up (Numba)
        return population_counts(programs, arrays)
    from evolve.kernels.gpu import tokens  # lazy: torch, only on the device path
    return dev.guarded(tokens.population_counts)(programs, arrays, **sizes, device=dev.torch)


def cpu_only(config, what: str) -> None:
    """Refuse a device for data scored on the CPU only (one line naming ``device``)."""
    device = device_of(config)
    if device != CPU:
        raise DeviceError.of("device", f"{device!r}: {what} are scored on the CPU; use "
                             "device 'cpu'")
