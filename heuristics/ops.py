"""Scalar operators of the primitive set, shared by every heuristic.

These are the one written definition of the protected operators. They are plain
Python functions that Numba can also compile inline (``register_jitable``), and
the population kernel in ``evolve/kernels.py`` implements exactly the same
formulas (tests compare the two on NaN, inf, 0, 1e-300 and huge values).

Conventions (NaN in, NaN out unless said otherwise):
- pdiv(a, b)  = a / b if |b| > 1e-9 else 1.0      (NaN b gives 1.0)
- pmin(a, b)  = a if a < b else b                  (NaN a gives b)
- pmax(a, b)  = a if a > b else b                  (NaN a gives b)
- plog(a)     = log|a| if |a| > 1e-12 else log(1e-12)   (NaN gives log(1e-12))
- pexp(a)     = exp(a) if a < 50 else exp(50)      (NaN gives exp(50))
- psqrt(a)    = sqrt|a|
- ite(c, a, b) = a if c else b
"""

import math

from numba.extending import register_jitable

DIV_EPS = 1e-9
LOG_EPS = 1e-12
LOG_FLOOR = math.log(LOG_EPS)
EXP_MAX = 50.0
EXP_CAP = math.exp(EXP_MAX)


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
    return math.log(x) if x > LOG_EPS else LOG_FLOOR


@register_jitable
def pexp(a):
    return math.exp(a) if a < EXP_MAX else EXP_CAP


@register_jitable
def psqrt(a):
    return math.sqrt(abs(a))


@register_jitable
def square(a):
    return a * a


@register_jitable
def ite(c, a, b):
    return a if c else b
