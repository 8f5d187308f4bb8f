"""DEAP's double tournament over arrays, drawing the same random numbers.

``tools.selDoubleTournament(..., fitness_first=True)`` spends most of a
generation's Python time on ``random.choice`` calls and Fitness comparisons:
14 draws and 12 comparisons per selected individual. This module makes the same
selection from a fitness array and a size array in one compiled loop, and takes
its random numbers from the same Mersenne Twister stream in the same order, so
a run selects exactly the individuals DEAP would and leaves the generator in
the same state (tested against DEAP in tests/test_selection.py).

How the stream is read: CPython's ``getrandbits(k)`` for k <= 32 is the top k
bits of the next 32-bit output word, ``random()`` takes the top 27 and 26 bits
of the next two words, ``choice(seq)`` draws ``getrandbits(n.bit_length())``
until the value is below ``n = len(seq)``, and ``getrandbits(32 * m)`` hands
out the next m words, least significant first (on a little-endian machine).
So the selection reads a block of words, finds how many it used, rewinds and
advances the generator by exactly that many. ``stream_matches()`` checks these
facts on the running interpreter once; where they do not hold, the engine
calls DEAP's own operator instead.
"""

from __future__ import annotations

import functools
import random
import sys

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _scan(words, n, shift, k, fitness_size, prob_small, wfit, sizes, out):
    """Fill ``out`` with k selected indices; return the words used (-1: too few)."""
    nw = words.shape[0]
    w = 0
    for i in range(k):
        pair0 = 0
        pair1 = 0
        for j in range(2):
            best = -1
            for _ in range(fitness_size):
                while True:
                    if w >= nw:
                        return -1
                    r = np.int64(words[w] >> shift)
                    w += 1
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
        if w + 2 > nw:
            return -1
        a = np.float64(words[w] >> 5)
        b = np.float64(words[w + 1] >> 6)
        w += 2
        u = (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)
        out[i] = small if u < prob else large
    return w


def _words(gen, m: int) -> np.ndarray:
    """The next m 32-bit output words of ``gen`` (a Random or the random module)."""
    raw = np.frombuffer(gen.getrandbits(32 * m).to_bytes(4 * m, "little"), dtype="<u4")
    return raw[::-1] if sys.byteorder == "big" else raw


@functools.lru_cache(maxsize=1)
def stream_matches() -> bool:
    """Whether this interpreter's ``random`` hands out numbers as described above."""
    a, b = random.Random(20261123), random.Random(20261123)
    w = _words(a, 64)
    pos = 0
    for n in (1, 2, 3, 7, 1000, 1024, 1025, 65537):
        shift = 32 - n.bit_length()
        want = b.choice(range(n))
        while True:
            r = int(w[pos]) >> shift
            pos += 1
            if r < n:
                break
        if r != want:
            return False
        u = (float(w[pos] >> 5) * 67108864.0 + float(w[pos + 1] >> 6)) / 9007199254740992.0
        pos += 2
        if u != b.random():
            return False
    b.getrandbits(32 * (64 - pos))
    return a.getstate() == b.getstate()


def double_tournament(gen, wfit: np.ndarray, sizes: np.ndarray, k: int, fitness_size: int,
                      parsimony_size: float, chunk: int = 65_536) -> np.ndarray:
    """Indices chosen by ``selDoubleTournament(pop, k, fitness_size, parsimony_size,
    fitness_first=True)`` for a population with weighted fitness ``wfit`` and tree
    sizes ``sizes``, drawing from ``gen`` (a Random, or the random module) exactly
    as DEAP would. Call only where ``stream_matches()``. Picks are made ``chunk``
    at a time, which bounds the block of random words held at once."""
    n = len(wfit)
    bits = n.bit_length()
    wfit = np.ascontiguousarray(wfit, dtype=np.float64)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    out = np.empty(k, dtype=np.int64)
    for start in range(0, k, chunk):
        part = out[start:start + chunk]
        # expected words: 2 tournaments x fitness_size draws, each 2**bits / n words
        # on average (rejections), plus 2 for random(); some spare
        m = int(len(part) * (2 * fitness_size * (2 ** bits / n) + 2) * 1.1) + 256
        state = gen.getstate()
        while True:
            used = _scan(_words(gen, m), n, 32 - bits, len(part), fitness_size,
                         parsimony_size / 2.0, wfit, sizes, part)
            gen.setstate(state)
            if used >= 0:
                break
            m *= 2
        gen.getrandbits(32 * used)
    return out
