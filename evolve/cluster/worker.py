"""What runs next to a shard (in a worker process, or in this one).

Workers import this module by name: tasks carry only a shard's path and the
linearised programs (plain arrays), never pickled Numba functions.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.spec import TraceArrays
from evolve.data.shards import map_shard
import os
import socket
import time
from evolve.data.traces import TraceSplit
from evolve.lang import treeio
import signal
import resource
import sys
from evolve.kernels.speculative import prepared
from evolve.kernels.speculative import population_sums
from evolve.lang.treeio import Programs
import numba


class Shard:
    """A loaded shard, kept in the worker's memory: ``sa``, the trace kernels' arrays of
    its rows, and for task traces (labelled shards) ``task``, the task objectives'
    ``TaskData``. A labelled shard makes each on first use, so a task run never builds
    the trace kernels' arrays and a trace run on task traces never the task's."""

    def __init__(self, path, meta: dict | None = None, sa=None):
        self.path = str(path)
        self.meta = meta
        self._sa = sa
        self._task = None

    @property
    def sa(self):
        if self._sa is None:
            self._sa = kernel_arrays(map_shard(self.path, self.meta))
        return self._sa

    @property
    def task(self):
        if self._task is None:
            from evolve.objectives.task_data import TaskData   # lazy: task shards only
            ts = map_shard(self.path, self.meta)
            self._task = TaskData.of_columns(ts.columns, ts.meta)
        return self._task


def kernel_arrays(ts):
    """TraceArrays of a split or shard, every array a plain writable ndarray (so
    memory-mapped shards and .npz splits compile to one kernel signature)."""
    sa = TraceArrays.from_split(ts)
    sa = TraceArrays(**{f.name: _plain(getattr(sa, f.name)) for f in fields(sa)})
    prepared(sa)
    return sa


def _plain(a):
    """``a`` as a writable C-contiguous ndarray: copied only when it is a read-only or
    memory-mapped view (a fresh array, such as the candidate matrix, is kept: a copy
    of it would double the largest array of a shard while loading)."""
    if not isinstance(a, np.ndarray):
        return a
    if isinstance(a, np.memmap) or not a.flags.writeable or not a.flags.c_contiguous:
        return np.array(a)
    return a


def load_shard(path: str, meta: dict) -> Shard:
    """Map a (validated) shard and build its kernel arrays (task traces: the task
    objectives' arrays), once."""
    if "labels" in meta:                   # the trace or the task objectives' arrays
        return Shard(path, meta)           # are made on first use (see Shard)
    return Shard(path, meta, kernel_arrays(map_shard(path, meta)))


def score(shard: Shard, payload: tuple, with_kl: bool, threads: int = 0,
          blocks=None, tail_cap: float = TAIL_OFF) -> np.ndarray:
    """Exact fixed-point sums of every program on one shard (or on its blocks
    ``blocks``, shard-local numbers), int64 (P, C, 2)."""
    if threads:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    sa = shard.sa if blocks is None else shard.sa.blocks(blocks)
    return population_sums(Programs(*payload), sa, with_kl, tail_cap)


def timed_score(shard: Shard, payload: tuple, with_kl: bool, threads: int = 0, blocks=None,
                tail_cap: float = TAIL_OFF):
    """``score``, the seconds it took and the process that ran it (host, pid): the
    rest of a call's wall time is communication and scheduling."""
    t = time.perf_counter()
    out = score(shard, payload, with_kl, threads, blocks, tail_cap)
    return out, time.perf_counter() - t, (socket.gethostname(), os.getpid())


def warm(ts) -> None:
    """Compile (or load from the cache) the trace kernel for these array types, on
    one block of ``ts`` (and, for task traces, the task objectives' kernels): run here
    before workers start, so they only read the cache."""
    g = int(ts.meta["block_size"])
    one = TraceSplit({f: np.array(ts.columns[f][:g]) for f in ts.columns}, ts.meta)
    sa = kernel_arrays(one)
    progs = treeio.linearise([treeio.parse("pmin(1.0, pdiv(target_prob, draft_prob))")])
    for with_kl in (False, True):
        population_sums(progs, sa, with_kl)
    if "labels" in ts.meta:
        from evolve.objectives.task_data import TaskData   # lazy: task shards only
        TaskData.of_columns(one.columns, one.meta).sums(progs)


def dask_setup(worker) -> None:
    """A LocalCluster worker's preload: ignore SIGINT. A terminal's Ctrl-C reaches the
    whole process group; the driver finishes or abandons the generation, saves,
    and closes the workers itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (what the cluster benchmark asks workers)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)
