"""CPython's random numbers, drawn in compiled code.

DEAP's operators draw from Python's ``random`` module. To run them over arrays
and still make the same choices (evolve.selection, evolve.vary), compiled loops
run the same Mersenne Twister on the state ``random.Random.getstate()`` hands
out, and read it as CPython does:

- ``getrandbits(k)``, k <= 32: the top k bits of the next 32-bit output word;
- ``random()``: the top 27 and 26 bits of the next two words, as a 53-bit float;
- ``_randbelow(n)`` (``choice``, ``randrange``, ``randint``): ``getrandbits(k)``
  with k = n.bit_length(), drawn again until the value is below n.

A loop takes the state as arrays (``state_arrays``), advances it, and the
caller puts it back (``set_state``). ``stream_matches()`` checks all of this on
the running interpreter once; where it does not hold, the engine runs DEAP's
own operators instead.
"""

from __future__ import annotations

import functools
import random

import numpy as np
from numba import njit

N = 624


@njit(cache=True, nogil=True)
def _twist(mt):
    for kk in range(N):
        y = (mt[kk] & 0x80000000) | (mt[(kk + 1) % N] & 0x7FFFFFFF)
        v = mt[(kk + 397) % N] ^ (y >> 1)
        if y & 1:
            v ^= 0x9908B0DF
        mt[kk] = v


@njit(cache=True, nogil=True)
def _temper(y):
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    return y ^ (y >> 18)


@njit(cache=True, nogil=True)
def block(mt, buf, start):
    """buf[start:] = the outputs of state words mt[start:]: a block a loop can
    read with its index in a local variable, twisting and refilling at the end
    (faster than ``word``, whose index lives in an array)."""
    for i in range(start, N):
        buf[i] = _temper(mt[i])


@njit(cache=True, nogil=True)
def bits_of(n):
    """n.bit_length() for n >= 0."""
    k = 0
    while n > 0:
        k += 1
        n >>= 1
    return k


@njit(cache=True, nogil=True)
def unit(a, b):
    """random() from two consecutive 32-bit outputs."""
    return (np.float64(a >> 5) * 67108864.0 + np.float64(b >> 6)) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def word(mt, pos):
    """The next 32-bit output (mt: the 624 state words, pos[0]: the index)."""
    if pos[0] >= N:
        _twist(mt)
        pos[0] = 0
    y = mt[pos[0]]
    pos[0] += 1
    return _temper(y)


@njit(cache=True, nogil=True)
def uniform01(mt, pos):
    """``random.random()``."""
    a = word(mt, pos)
    return unit(a, word(mt, pos))


@njit(cache=True, nogil=True)
def below(mt, pos, n):
    """``random._randbelow(n)`` for n in 1..2**32 - 1 (one word per draw)."""
    shift = 32 - bits_of(n)
    r = word(mt, pos) >> shift
    while r >= n:
        r = word(mt, pos) >> shift
    return r


def state_arrays(gen) -> tuple:
    """A ``random.Random``'s (or the module's) state as (words, position array,
    version, gauss_next) for the compiled loops."""
    version, internal, gauss = gen.getstate()
    return (np.array(internal[:N], dtype=np.int64), np.array([internal[N]], dtype=np.int64),
            version, gauss)


def set_state(gen, mt, pos, version, gauss) -> None:
    """Put a state from ``state_arrays``, as the loops left it, back into ``gen``."""
    gen.setstate((version, tuple(mt.tolist()) + (int(pos[0]),), gauss))


@njit(cache=True, nogil=True)
def _replay(mt, pos, calls):
    """calls[i] < 0: random(); otherwise _randbelow(calls[i])."""
    out = np.empty(calls.shape[0], dtype=np.float64)
    for i in range(calls.shape[0]):
        out[i] = uniform01(mt, pos) if calls[i] < 0 else below(mt, pos, calls[i])
    return out


@functools.lru_cache(maxsize=1)
def stream_matches() -> bool:
    """Whether the compiled reading of the stream is this interpreter's: random(),
    choice, randrange and randint over several twists of the generator give the
    same values and leave the same state."""
    calls = np.array([-1, 1, 2, 3, 5, 7, 13, 17, 1000, 1024, 1025, 65537, 2**31, 2**32 - 1] * 150,
                     dtype=np.int64)
    py = random.Random(20261123)
    mt, pos, version, gauss = state_arrays(py)
    got = _replay(mt, pos, calls).tolist()
    want = []
    for i, c in enumerate(calls.tolist()):
        if c < 0:
            want.append(py.random())
        elif i % 3 == 0:
            want.append(py.choice(range(c)))
        elif i % 3 == 1:
            want.append(py.randrange(c))
        else:
            want.append(py.randint(0, c - 1))
    ours = random.Random()
    set_state(ours, mt, pos, version, gauss)
    return got == want and ours.getstate() == py.getstate()
