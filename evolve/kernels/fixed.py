"""Exact sums of real numbers: 128-bit fixed point, so any order and any split adds up the same.

Float addition is not associative: the sum of a split's blocks computed in one
pass differs in the last bits from the sum of its shards' sums. The trace
kernel therefore rounds each block's contribution once to a fixed-point
integer (``FRAC_BITS`` fractional bits, 2^-80 ~ 8e-25, so even the tiny reach
weights of deep block positions keep float precision) and adds those integers
in 128 bits (a signed ``hi`` word and a wrapping ``lo`` word, both int64). Integer addition is associative, so one pass, any tiling, any thread
count and any number of shards give the same integers, and ``to_float`` turns
them into the same float64 sums, bit for bit.

A block's value is limited to ``|x| <= LIMIT`` (2^30; tokens^2 of a block is at
most (g + 1)^2); larger values saturate at the limit and NaN adds nothing,
instead of being undefined, so the jitted code never raises. Totals are exact
below 2^47 (1.4e14) in absolute value, far beyond any trace.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FRAC_BITS = 80
HI_SHIFT = FRAC_BITS - 64                  # the hi word counts units of 2^-16
LIMIT = float(2 ** 30)                    # |block value| saturates here
_SIGN = np.int64(-2 ** 63)                # xor with it: unsigned order as signed order
_TWO63 = float(2 ** 63)
_TWO64 = float(2 ** 64)


@njit(cache=True, nogil=True, inline="always")
def add_to(acc, c, x):
    """acc[c] (hi, lo) += x rounded to fixed point, exactly (saturating at
    +-LIMIT; NaN adds nothing)."""
    if x != x:
        return
    if x > LIMIT:
        x = LIMIT
    elif x < -LIMIT:
        x = -LIMIT
    neg = x < 0.0
    t = (-x if neg else x) * 2.0 ** HI_SHIFT      # the magnitude: t - floor(t) is exact
    hf = np.floor(t)
    lf = np.floor((t - hf) * _TWO64 + 0.5)       # in [0, 2^64]
    hi = np.int64(hf)
    if lf >= _TWO64:
        hi += 1
        lo = np.int64(0)
    elif lf >= _TWO63:
        lo = np.int64(lf - _TWO63) ^ _SIGN
    else:
        lo = np.int64(lf)
    if neg:                                      # two's complement of the 128-bit value
        hi = -hi - (1 if lo != 0 else 0)
        lo = -lo
    old = acc[c, 1]
    s = old + lo                                 # wraps: the low 64 bits
    carry = 1 if (s ^ _SIGN) < (old ^ _SIGN) else 0
    acc[c, 0] += hi + carry
    acc[c, 1] = s


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact sum of two fixed-point arrays (..., 2) (hi, lo), as the kernel adds."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    with np.errstate(over="ignore"):
        lo = a[..., 1] + b[..., 1]
        carry = ((lo ^ _SIGN) < (a[..., 1] ^ _SIGN)).astype(np.int64)
        hi = a[..., 0] + b[..., 0] + carry
    return np.stack([hi, lo], axis=-1)


def total(parts) -> np.ndarray:
    """Exact sum of fixed-point arrays (any order gives the same integers)."""
    parts = list(parts)
    out = np.zeros_like(np.asarray(parts[0], dtype=np.int64))
    for p in parts:
        out = add(out, p)
    return out


def to_float(fx: np.ndarray) -> np.ndarray:
    """float64 values of fixed-point (..., 2) arrays: a deterministic function of
    the integers (correctly rounded for |value| < 2^37)."""
    fx = np.asarray(fx, dtype=np.int64)
    lo = np.ascontiguousarray(fx[..., 1]).view(np.uint64)
    top = (lo >> np.uint64(24)).astype(np.float64)          # 40 bits: exact
    low = (lo & np.uint64(0xFFFFFF)).astype(np.float64)      # 24 bits: exact
    return (fx[..., 0].astype(np.float64) * 2.0 ** -HI_SHIFT
            + (top * 2.0 ** (24 - FRAC_BITS) + low * 2.0 ** -FRAC_BITS))
