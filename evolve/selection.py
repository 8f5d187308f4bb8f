"""DEAP's double tournament over arrays, drawing the same random numbers.

``tools.selDoubleTournament(..., fitness_first=True)`` spends most of a
generation's Python time on ``random.choice`` calls and Fitness comparisons:
14 draws and 12 comparisons per selected individual. This module makes the same
selection from a fitness array and a size array in one compiled loop, and takes
its random numbers from the same Mersenne Twister stream in the same order, so
a run selects exactly the individuals DEAP would and leaves the generator in
the same state (tested against DEAP in tests/test_selection.py).

The stream is read in compiled code as evolve.stream describes;
``stream_matches()`` checks that reading on the running interpreter once, and
where it does not hold, the engine calls DEAP's own operator instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from evolve import stream

# where this is False the engine calls DEAP's own operator
stream_matches = stream.stream_matches


@njit(cache=True, nogil=True)
def _tournament(mt, pos, wfit, sizes, k, fitness_size, prob_small, out):
    """Fill ``out`` with k picks, drawing as DEAP does (see the module's doc).
    The generator's outputs are read a block at a time with a local index."""
    n = wfit.shape[0]
    shift = 32 - stream.bits_of(n)
    buf = np.empty(stream.N, dtype=np.int64)
    ab = np.empty(2, dtype=np.int64)
    p = pos[0]
    if p < stream.N:
        stream.block(mt, buf, p)
    for i in range(k):
        pair0 = 0
        pair1 = 0
        for j in range(2):
            best = -1
            for _ in range(fitness_size):
                while True:                   # random.choice(individuals)
                    if p >= stream.N:
                        stream._twist(mt)
                        stream.block(mt, buf, 0)
                        p = 0
                    r = buf[p] >> shift
                    p += 1
                    if r < n:
                        break
                # max(aspirants, key=fitness): the first aspirant, replaced by a
                # later one whose fitness is not <= it (Fitness.__gt__)
                if best < 0 or not (wfit[r] <= wfit[best]):
                    best = r
            if j == 0:
                pair0 = best
            else:
                pair1 = best
        prob = prob_small
        small, large = pair0, pair1
        if sizes[small] > sizes[large]:
            small, large = large, small
        elif sizes[small] == sizes[large]:
            prob = 0.5
        for h in range(2):                    # random(): two words
            if p >= stream.N:
                stream._twist(mt)
                stream.block(mt, buf, 0)
                p = 0
            ab[h] = buf[p]
            p += 1
        out[i] = small if stream.unit(ab[0], ab[1]) < prob else large
    pos[0] = p


def tournament(mt, pos, wfit: np.ndarray, sizes: np.ndarray, k: int, fitness_size: int,
               parsimony_size: float) -> np.ndarray:
    """``double_tournament`` drawing from a generator state of
    ``stream.state_arrays``, advanced in place."""
    out = np.empty(k, dtype=np.int64)
    _tournament(mt, pos, np.ascontiguousarray(wfit, dtype=np.float64),
                np.ascontiguousarray(sizes, dtype=np.int64), k, fitness_size,
                parsimony_size / 2.0, out)
    return out


def double_tournament(gen, wfit: np.ndarray, sizes: np.ndarray, k: int, fitness_size: int,
                      parsimony_size: float) -> np.ndarray:
    """Indices chosen by ``selDoubleTournament(pop, k, fitness_size, parsimony_size,
    fitness_first=True)`` for a population with weighted fitness ``wfit`` and tree
    sizes ``sizes``, drawing from ``gen`` (a Random, or the random module) exactly
    as DEAP would. Call only where ``stream_matches()``."""
    mt, pos, version, gauss = stream.state_arrays(gen)
    out = tournament(mt, pos, wfit, sizes, k, fitness_size, parsimony_size)
    stream.set_state(gen, mt, pos, version, gauss)
    return out
