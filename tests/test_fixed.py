"""Exact fixed-point sums (evolve.kernels.fixed): any order, any split, the same bits."""

import math
from fractions import Fraction

import numpy as np
from numba import njit

from evolve.kernels import fixed

N_VALUES = 2000


@njit
def _sum(xs, order):
    acc = np.zeros((1, 2), dtype=np.int64)
    for i in order:
        fixed.add_to(acc, 0, xs[i])
    return acc


def _exact(acc) -> Fraction:
    hi, lo = int(acc[0, 0]), int(acc[0, 1]) % 2 ** 64
    return Fraction(hi * 2 ** 64 + lo, 2 ** fixed.FRAC_BITS)


def test_sums_are_exact_and_order_free():
    rng = np.random.default_rng(3)
    xs = np.concatenate([rng.normal(0, 100, N_VALUES // 2),
                         rng.uniform(-1e-18, 1e-18, N_VALUES // 2), [2.0 ** 29, -3.5]])
    whole = _sum(xs, np.arange(xs.size))
    shuffled = _sum(xs, rng.permutation(xs.size))
    assert np.array_equal(whole, shuffled)
    parts = [_sum(xs, idx) for idx in np.array_split(rng.permutation(xs.size), 7)]
    assert np.array_equal(fixed.total(parts), whole)
    assert np.array_equal(fixed.total(parts[::-1]), whole)
    # the integers are the sum of each value rounded to 2^-80 (halves away from 0)
    unit = 2 ** fixed.FRAC_BITS
    want = sum(Fraction(int(math.copysign(1, x)) *
                        math.floor(abs(Fraction(float(x))) * unit + Fraction(1, 2)), unit)
               for x in xs)
    assert _exact(whole) == want
    assert fixed.to_float(whole)[0] == float(want)


def test_saturates_and_ignores_nan():
    acc = _sum(np.array([np.inf, np.nan, -1e300, 1.0]), np.arange(4))
    assert _exact(acc) == 1


def test_carries_across_the_low_word():
    # many values whose low words overflow: the carry into hi must be exact
    xs = np.full(1000, 2.0 ** -17 + 2.0 ** -69)
    acc = _sum(xs, np.arange(xs.size))
    assert _exact(acc) == 1000 * (Fraction(1, 2 ** 17) + Fraction(1, 2 ** 69))
    neg = _sum(-xs, np.arange(xs.size))
    assert _exact(neg) == -_exact(acc)
    assert not fixed.total([acc, neg]).any()
