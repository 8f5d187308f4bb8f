"""Scalar operators of the primitive set, shared by every heuristic.

These are the one written definition of the protected operators. They are plain
Python functions that Numba can also compile inline (``register_jitable``), and
the population kernel in ``evolve/kernels/interpreter.py`` implements exactly the same
formulas (tests compare the two on NaN, inf, 0, 1e-300 and huge values).

Conventions (NaN in, NaN out unless said otherwise):
- pdiv(a, b)  = a / b if |b| > 1e-9 else 1.0      (NaN b gives 1.0)
- pmin(a, b)  = a if a < b else b                  (NaN a gives b)
- pmax(a, b)  = a if a > b else b                  (NaN a gives b)
- plog(a)     = log|a| if |a| > 1e-12 else log(1e-12)   (NaN gives log(1e-12))
- pexp(a)     = exp(a) if a < 50 else exp(50)      (NaN gives exp(50))
- psqrt(a)    = sqrt|a|
- ite(c, a, b) = a if c else b

exp and log are this module's own, ``exp_poly`` and ``log_poly``: range reduction
and a polynomial, plain float64 arithmetic with no table, call or branch, so the
compiled kernels evaluate them as vector instructions (libm's exp and log are one
scalar call per element, about 4 ns each). The same definitions run everywhere a
rule is evaluated: the kernels, the generated champion code (plain Python or
Numba) and the numpy reference (``evolve.lang.primitives``, which compiles these
functions as ufuncs), so all of them give the same bits. Accuracy against libm
(``tests/test_ops_math.py``): within 1 ulp over the whole range that reaches them
(exp: below 50 down to where the result is 0; log: 1e-12 up to inf), and the same
bits as libm on 92% (exp) and 97% (log) of random arguments. Exports to other
array libraries (``evolve export``) use their own exp and log, which may differ
from these in the last bit.
"""

import math

import numpy as np
from numba.extending import register_jitable

DIV_EPS = 1e-9
LOG_EPS = 1e-12
LOG_FLOOR = math.log(LOG_EPS)
EXP_MAX = 50.0
EXP_CAP = math.exp(EXP_MAX)

# Range reduction: ln 2 split so that k * LN2_HI is exact for |k| < 2^11.
LN2_HI = 6.93147180369123816490e-01
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e+00
SQRT2 = 1.4142135623730951
EXP_LO, EXP_HI = -746.0, 710.0     # exp is 0 below, inf above (arguments are clamped)
# exp(r) = 1 + r + r^2 (E2 + r (E3 + ... + r E13)), |r| <= ln2 / 2: Taylor, 1/n!
E2, E3, E4, E5, E6, E7, E8, E9, E10, E11, E12, E13 = (1.0 / math.factorial(n)
                                                      for n in range(2, 14))
# log(1 + f) = 2 atanh(s), s = f / (2 + f): R = sum_j 2 s^(2j) / (2j + 1), j = 1..10
L1, L2, L3, L4, L5, L6, L7, L8, L9, L10 = (2.0 / (2 * j + 1) for j in range(1, 11))
_MANTISSA = np.int64(0xFFFFFFFFFFFFF)
_EXPONENT_ONE = np.int64(1023 << 52)


@register_jitable
def _bits(x):
    return np.float64(x).view(np.int64)


@register_jitable
def _float(b):
    return np.int64(b).view(np.float64)


@register_jitable
def exp_poly(x):
    """e^x within 1 ulp of libm for x < 710 (0 below -745.2; NaN is the caller's)."""
    x = EXP_LO if x < EXP_LO else (EXP_HI if x > EXP_HI else x)
    k = np.rint(x * INV_LN2)
    r = (x - k * LN2_HI) - k * LN2_LO
    p = r * (E2 + r * (E3 + r * (E4 + r * (E5 + r * (E6 + r * (E7 + r * (
        E8 + r * (E9 + r * (E10 + r * (E11 + r * (E12 + r * E13)))))))))))
    y = 1.0 + (r + r * p)
    ki = np.int64(k)                 # y * 2^k in two exact steps (subnormal results too)
    k1 = ki >> 1
    return y * _float((k1 + 1023) << 52) * _float((ki - k1 + 1023) << 52)


@register_jitable
def log_poly(x):
    """log(x) within 1 ulp of libm for normal x > 0 and +inf (the callers pass x > 1e-12)."""
    b = _bits(x)
    m = _float((b & _MANTISSA) | _EXPONENT_ONE)       # x = m 2^e, m in [1, 2)
    big = m > SQRT2
    m = m * 0.5 if big else m                         # m in [sqrt(1/2), sqrt(2))
    e = np.float64((b >> 52) - 1023) + (1.0 if big else 0.0)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    R = z * (L1 + z * (L2 + z * (L3 + z * (L4 + z * (L5 + z * (L6 + z * (
        L7 + z * (L8 + z * (L9 + z * L10)))))))))
    y = e * LN2_HI + (f - (s * (f - R) - e * LN2_LO))
    return x if x == np.inf else y


@register_jitable
def pdiv(a, b):
    return a / b if abs(b) > DIV_EPS else 1.0


@register_jitable
def pmin(a, b):
    return a if a < b else b


@register_jitable
def pmax(a, b):
    return a if a > b else b


@register_jitable
def plog(a):
    x = abs(a)
    return log_poly(x) if x > LOG_EPS else LOG_FLOOR


@register_jitable
def pexp(a):
    return exp_poly(a) if a < EXP_MAX else EXP_CAP


@register_jitable
def psqrt(a):
    return math.sqrt(abs(a))


@register_jitable
def square(a):
    return a * a


@register_jitable
def ite(c, a, b):
    return a if c else b
