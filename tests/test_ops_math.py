"""heuristics.ops' own exp and log (``exp_poly``, ``log_poly``): accuracy against libm
over the whole range that reaches them, the protected operators' conventions on
edge inputs, and the same bits in every place a rule is evaluated (plain Python,
Numba, the numpy reference's ufuncs and the population kernel)."""

import math

import numpy as np
import pytest
from numba import njit

from evolve.kernels import tokens as tk
from evolve.lang import primitives as P
from evolve.lang import treeio
from heuristics import ops as O

TINY = 5e-324                   # the smallest subnormal


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in units in the last place between float64 arrays of one sign."""
    return np.abs(a.view(np.int64) - b.view(np.int64))


@njit(error_model="numpy")
def _exp_all(x, out):
    for i in range(x.shape[0]):
        out[i] = O.exp_poly(x[i])


@njit(error_model="numpy")
def _log_all(x, out):
    for i in range(x.shape[0]):
        out[i] = O.log_poly(x[i])


def _libm(f, x):
    return np.array([f(float(v)) for v in x])


def _exp_args(rng):
    return np.concatenate([
        rng.uniform(-746.0, 50.0, 300_000),          # everything pexp passes on
        rng.uniform(-1.0, 1.0, 100_000),
        rng.uniform(-1e-6, 1e-6, 20_000),
        rng.uniform(-745.2, -708.0, 50_000),         # subnormal results
        np.array([0.0, -0.0, TINY, -TINY, 1e-300, -1e-300, 49.999999, -745.13, -745.14,
                  -708.39, -708.40, math.log(2), -math.log(2), 0.5 * math.log(2)])])


def _log_args(rng):
    return np.concatenate([
        np.exp(rng.uniform(math.log(1e-12), 709.0, 300_000)),   # everything plog passes on
        rng.uniform(0.5, 2.0, 100_000),
        1.0 + rng.uniform(-1e-6, 1e-6, 20_000),
        np.array([1e-12 * (1 + 1e-15), 1.0, 2.0, 0.5, 1.7976931348623157e308, O.SQRT2,
                  np.nextafter(O.SQRT2, 2.0), np.nextafter(O.SQRT2, 0.0), math.e, 10.0])])


def test_exp_is_within_one_ulp_of_libm_over_its_whole_range():
    x = _exp_args(np.random.default_rng(1))
    got = np.empty_like(x)
    _exp_all(x, got)
    u = _ulps(got, _libm(math.exp, x))
    assert u.max() <= 1
    assert (u == 0).mean() > 0.9                  # the same bits as libm on most arguments
    assert got[x < -745.14].max(initial=0.0) == 0.0 and np.all(got >= 0.0)


def test_log_is_within_one_ulp_of_libm_over_its_whole_range():
    x = _log_args(np.random.default_rng(2))
    got = np.empty_like(x)
    _log_all(x, got)
    u = _ulps(np.abs(got), np.abs(_libm(math.log, x)))
    assert u.max() <= 1
    assert np.all(np.sign(got) == np.sign(_libm(math.log, x)))
    assert (u == 0).mean() > 0.9
    assert O.log_poly(1.0) == 0.0 and O.log_poly(math.inf) == math.inf


EDGE = [math.nan, math.inf, -math.inf, 0.0, -0.0, TINY, -TINY, 1e-300, 1e-13, 1e-12,
        1.0000001e-12, 0.5, 1.0, 2.0, 49.99999999, 50.0, 50.0000001, 700.0, 710.0, 1e300,
        -1e300, 1.7976931348623157e308, -745.2, -1000.0]


@pytest.mark.parametrize("x", EDGE)
def test_protected_exp_and_log_keep_their_conventions(x):
    """plog(a) = log|a| for |a| > 1e-12, else log(1e-12) (NaN too); pexp(a) = exp(a)
    for a < 50, else exp(50) (NaN too): libm's answers wherever libm's are exact."""
    lx = O.plog(x)
    if not abs(x) > O.LOG_EPS:
        assert lx == O.LOG_FLOOR
    elif math.isinf(x):
        assert lx == math.inf
    else:
        assert abs(lx - math.log(abs(x))) <= 2.3e-16 * abs(math.log(abs(x)))
    ex = O.pexp(x)
    if not x < O.EXP_MAX:
        assert ex == O.EXP_CAP
    else:
        assert abs(ex - math.exp(x)) <= 2.3e-16 * math.exp(x)


def test_python_numba_numpy_and_the_kernel_give_the_same_bits():
    """One definition: heuristics.ops in plain Python, compiled by Numba inside a
    loop (vector code), as the numpy reference's ufunc, and in the population kernel
    (plog/pexp of an input column and of a subtree) agree bit for bit."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.uniform(-60, 60, 3000), rng.normal(0, 1e-6, 500),
                        rng.uniform(-800, 800, 500), np.array(EDGE)])
    py = {"plog": np.array([O.plog(float(v)) for v in x]),
          "pexp": np.array([O.pexp(float(v)) for v in x])}
    for name in ("plog", "pexp"):
        assert np.array_equal(P.BY_NAME[name].numpy(x), py[name], equal_nan=True), name
    # the kernel over a matrix whose input rows are x (and x shifted by a subtree)
    X = np.vstack([x, np.full_like(x, 0.25)] + [np.zeros_like(x)] * (P.N_INPUTS - 2))
    trees = ["plog(draft_prob)", "pexp(draft_prob)", "plog(add(draft_prob, target_prob))",
             "pexp(sub(draft_prob, target_prob))"]
    got = tk.matrix_thresholds(treeio.linearise([treeio.parse(t) for t in trees]), X)
    assert np.array_equal(got[0], py["plog"], equal_nan=True)
    assert np.array_equal(got[1], py["pexp"], equal_nan=True)
    assert np.array_equal(got[2], np.array([O.plog(float(v) + 0.25) for v in x]))
    assert np.array_equal(got[3], np.array([O.pexp(float(v) - 0.25) for v in x]))
