"""Trace splits as the trace objectives read them: the ``Split`` protocol (in this
process, ``ArraySplit``; sharded, ``evolve.cluster.session.ClusterSplit``), the
evaluator over arrays in this process, and the TraceArrays a report needs."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from evolve.data.traces import TraceSplit
from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.base import Evaluator
from evolve.objectives.spec import TraceArrays


class Split(Protocol):
    """What the trace objectives read of a split, the same for a split in this
    process (``ArraySplit``) and a sharded one scored where its shards are
    (``evolve.cluster.session.ClusterSplit``)."""

    meta: dict

    @property
    def shape(self):
        """``g``, ``k``, ``n`` (rows) and ``n_blocks`` of the whole split."""

    def sums(self, progs, with_kl: bool = True, blocks=None,
             tail_cap: float = TAIL_OFF) -> np.ndarray:
        """float64 kernel sums (``evolve.kernels.layout``), one row per program, over
        every block or over ``blocks``."""

    def evaluator(self, name: str, blocks=None, with_kl: bool = False,
                  tail_cap: float = TAIL_OFF) -> Evaluator:
        """An evaluator of these sums; its ``batch(blocks)`` one over some blocks."""

    def spec_arrays(self):
        """The whole split's TraceArrays in this process (finishing reports only)."""


class ArraySplit:
    """A trace split held in this process, behind the ``Split`` protocol."""

    def __init__(self, split, arrays=None):
        self.split = split
        self.meta = split.meta
        self._arrays = arrays        # the split's TraceArrays when already made

    def spec_arrays(self):
        if self._arrays is None:
            self._arrays = TraceArrays.from_split(self.split)
        return self._arrays

    @property
    def shape(self):
        return self.spec_arrays()

    def sums(self, progs, with_kl: bool = True, blocks=None,
             tail_cap: float = TAIL_OFF) -> np.ndarray:
        from evolve.kernels.speculative import population_objectives  # lazy: start-up (Numba)
        sa = self.spec_arrays()
        return population_objectives(progs, sa if blocks is None else sa.blocks(blocks),
                                     with_kl, tail_cap)

    def evaluator(self, name: str, blocks=None, with_kl: bool = False,
                  tail_cap: float = TAIL_OFF) -> Evaluator:
        sa = self.spec_arrays()
        return array_evaluator(sa if blocks is None else sa.blocks(blocks), name, with_kl,
                               tail_cap)


def as_split(split, arrays=None):
    """A trace split behind the split protocol: an in-memory TraceSplit is wrapped
    (``ArraySplit``, with its TraceArrays ``arrays`` when already made), a sharded
    one already offers it."""
    return ArraySplit(split, arrays) if isinstance(split, TraceSplit) else split


def array_evaluator(sa, name: str, with_kl: bool = False,
                    tail_cap: float = TAIL_OFF) -> Evaluator:
    """An evaluator over TraceArrays in this process; ``batch(blocks)`` gives one over
    some of its blocks (``--batch-blocks``)."""
    def kernel(progs):
        from evolve.kernels.speculative import population_objectives  # lazy: start-up (Numba)
        return population_objectives(progs, sa, with_kl, tail_cap)
    return Evaluator(name, kernel, sa, sa.n * sa.k,
                     batch=lambda blocks: array_evaluator(sa.blocks(blocks), f"{name} batch",
                                                          with_kl, tail_cap))


def spec_arrays(name: str, splits: dict, evaluators: dict):
    """A split's TraceArrays: the evaluator's when there is one, else made now."""
    ev = evaluators.get(name)
    if ev is not None and isinstance(ev.arrays, TraceArrays):
        return ev.arrays
    return as_split(splits[name]).spec_arrays()   # sharded: the whole split, loaded now
