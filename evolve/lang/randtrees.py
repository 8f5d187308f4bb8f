"""Random trees of the real primitive set, as the engine's initialisation makes them
(DEAP's ``genHalfAndHalf``), under a fixed seed: the one generator the tests and the
benchmarks use. Python's global random state is restored afterwards, so drawing
trees never changes a run's or another test's random stream."""

from __future__ import annotations

import random

from deap import gp

from evolve.lang import primitives as P
from evolve.lang import treeio


def deap_trees(pset, n: int, seed: int, min_h: int = 1, max_h: int = 6,
               distinct: bool = False) -> list:
    """``n`` DEAP trees of ``pset`` with heights ``min_h``..``max_h`` (``distinct``:
    no tree twice, by its text)."""
    state = random.getstate()
    random.seed(seed)
    try:
        out, seen = [], set()
        while len(out) < n:
            t = gp.PrimitiveTree(gp.genHalfAndHalf(pset, min_=min_h, max_=max_h))
            if distinct:
                if str(t) in seen:
                    continue
                seen.add(str(t))
            out.append(t)
        return out
    finally:
        random.setstate(state)


def random_trees(n: int, seed: int, trace: bool = False, min_h: int = 1,
                 max_h: int = 6) -> list:
    """``n`` trees of the token (or, ``trace``, the trace) primitive set as node lists
    (``treeio``)."""
    return [treeio.from_deap(t) for t in deap_trees(P.make_pset(trace=trace), n, seed,
                                                      min_h, max_h)]
