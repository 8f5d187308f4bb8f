"""Every Numba kernel of the harness.

Public wrappers check and prepare arrays, then call private ``_kernels`` that
never raise. Numba is imported here only, so commands that do not evaluate
anything start fast.

The population kernel interprets linearised programs (see ``treeio.linearise``)
over a split: threads over programs (``prange``), row tiles inside, one small
value stack per program in L1. Each program's counts are accumulated in row
order, so results do not depend on the thread count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from evolve import primitives as P
from evolve.fitness import EXPECTED_SCALE, Counts, quantise
from heuristics import ops as O

TILE = 256

# Opcodes as module constants, so Numba folds them.
OP_CONST = P.OP_CONST
ADD, SUB, MUL, PDIV = P.OP["add"], P.OP["sub"], P.OP["mul"], P.OP["pdiv"]
PMIN, PMAX, NEG, ABS = P.OP["pmin"], P.OP["pmax"], P.OP["neg"], P.OP["absf"]
PLOG, PEXP, PSQRT, SQUARE = P.OP["plog"], P.OP["pexp"], P.OP["psqrt"], P.OP["square"]
LT, ITE, AND, OR, NOT = P.OP["lt"], P.OP["ite"], P.OP["and_"], P.OP["or_"], P.OP["not_"]
DIV_EPS, LOG_EPS, LOG_FLOOR = O.DIV_EPS, O.LOG_EPS, O.LOG_FLOOR
EXP_MAX, EXP_CAP = O.EXP_MAX, O.EXP_CAP


@njit(cache=True, nogil=True, fastmath=False)
def _run_program(ops, consts, start, length, X, r0, m, stack):
    """Evaluate one program on rows r0..r0+m; the result is left in stack[0, :m]."""
    sp = 0
    for k in range(start, start + length):
        op = ops[k]
        if op < OP_CONST:
            src = X[op]
            dst = stack[sp]
            for i in range(m):
                dst[i] = src[r0 + i]
            sp += 1
        elif op == OP_CONST:
            c = consts[k]
            dst = stack[sp]
            for i in range(m):
                dst[i] = c
            sp += 1
        elif op <= PMAX:
            a = stack[sp - 1]
            b = stack[sp - 2]
            if op == ADD:
                for i in range(m):
                    b[i] = a[i] + b[i]
            elif op == SUB:
                for i in range(m):
                    b[i] = a[i] - b[i]
            elif op == MUL:
                for i in range(m):
                    b[i] = a[i] * b[i]
            elif op == PDIV:
                for i in range(m):
                    y = b[i]
                    b[i] = a[i] / y if abs(y) > DIV_EPS else 1.0
            elif op == PMIN:
                for i in range(m):
                    x = a[i]
                    y = b[i]
                    b[i] = x if x < y else y
            else:  # PMAX
                for i in range(m):
                    x = a[i]
                    y = b[i]
                    b[i] = x if x > y else y
            sp -= 1
        elif op <= SQUARE:
            a = stack[sp - 1]
            if op == NEG:
                for i in range(m):
                    a[i] = -a[i]
            elif op == ABS:
                for i in range(m):
                    a[i] = abs(a[i])
            elif op == PLOG:
                for i in range(m):
                    x = abs(a[i])
                    a[i] = math.log(x) if x > LOG_EPS else LOG_FLOOR
            elif op == PEXP:
                for i in range(m):
                    x = a[i]
                    a[i] = math.exp(x) if x < EXP_MAX else EXP_CAP
            elif op == PSQRT:
                for i in range(m):
                    a[i] = math.sqrt(abs(a[i]))
            else:  # SQUARE
                for i in range(m):
                    a[i] = a[i] * a[i]
        elif op == LT:
            a = stack[sp - 1]
            b = stack[sp - 2]
            for i in range(m):
                b[i] = 1.0 if a[i] < b[i] else 0.0
            sp -= 1
        elif op == ITE:
            c = stack[sp - 1]
            a = stack[sp - 2]
            b = stack[sp - 3]
            for i in range(m):
                b[i] = a[i] if c[i] != 0.0 else b[i]
            sp -= 2
        elif op == AND:
            a = stack[sp - 1]
            b = stack[sp - 2]
            for i in range(m):
                b[i] = 1.0 if (a[i] != 0.0 and b[i] != 0.0) else 0.0
            sp -= 1
        elif op == OR:
            a = stack[sp - 1]
            b = stack[sp - 2]
            for i in range(m):
                b[i] = 1.0 if (a[i] != 0.0 or b[i] != 0.0) else 0.0
            sp -= 1
        else:  # NOT
            a = stack[sp - 1]
            for i in range(m):
                a[i] = 0.0 if a[i] != 0.0 else 1.0


@njit(cache=True, nogil=True, inline="always")
def _tally(h, j0, m, rand, base, std_q, acc):
    """Add the decisions and expected sums of thresholds h[:m] (rows j0..) to acc.

    acc[0:3]: accepted, false accepts, false rejects; acc[3:6]: expected accepted,
    FA and FR in fixed point (see fitness.EXPECTED_SCALE). Integer sums are exact
    and order-free, so every caller agrees to the bit.
    """
    a0 = 0
    a1 = 0
    a2 = 0
    e0 = 0
    e1 = 0
    e2 = 0
    for i in range(m):
        x = h[i]
        j = j0 + i
        a = rand[j] < x
        b = base[j]
        a0 += a
        a1 += a and not b
        a2 += b and not a
        q = 0.0 if not (x > 0.0) else (1.0 if x > 1.0 else x)
        qi = np.int64(q * EXPECTED_SCALE)
        d = qi - std_q[j]
        e0 += qi
        e1 += d if d > 0 else 0
        e2 += -d if d < 0 else 0
    acc[0] += a0
    acc[1] += a1
    acc[2] += a2
    acc[3] += e0
    acc[4] += e1
    acc[5] += e2


@njit(parallel=True, cache=True, nogil=True)
def _population_counts(ops, consts, starts, lengths, max_stack, X, rand, base, std_q, out):
    n = X.shape[1]
    for p in prange(starts.shape[0]):
        stack = np.empty((max_stack, TILE), dtype=np.float64)
        acc = np.zeros(6, dtype=np.int64)
        for r0 in range(0, n, TILE):
            m = min(TILE, n - r0)
            _run_program(ops, consts, starts[p], lengths[p], X, r0, m, stack)
            _tally(stack[0], r0, m, rand, base, std_q, acc)
        for c in range(6):
            out[p, c] = acc[c]


@njit(parallel=True, cache=True, nogil=True)
def _population_thresholds(ops, consts, starts, lengths, max_stack, X, out):
    n = X.shape[1]
    for p in prange(starts.shape[0]):
        stack = np.empty((max_stack, TILE), dtype=np.float64)
        for r0 in range(0, n, TILE):
            m = min(TILE, n - r0)
            _run_program(ops, consts, starts[p], lengths[p], X, r0, m, stack)
            for i in range(m):
                out[p, r0 + i] = stack[0, i]


class SplitArrays:
    """A split prepared once for the kernels: contiguous columns, quantised std."""

    def __init__(self, ds):
        self.n = len(ds)
        self.X = ds.feature_matrix()
        self.rand = np.ascontiguousarray(ds.rand_value, dtype=np.float64)
        self.base = np.ascontiguousarray(ds.baseline_accepts, dtype=np.bool_)
        self.std_q = quantise(ds.standard_threshold())


def _check_inputs(programs, split: SplitArrays) -> None:
    """Programs may only load inputs the split has (the kernel never checks)."""
    loads = programs.ops[programs.ops < OP_CONST]
    if loads.size and int(loads.max()) >= split.X.shape[0]:
        name = P.INPUTS[int(loads.max())][0] if int(loads.max()) < len(P.INPUTS) else "?"
        raise ValueError(f"a program reads input '{name}', which this split does not have")


def population_counts(programs, split: SplitArrays) -> np.ndarray:
    """Counts for every program, int64 (P, 6): accepted, FA, FR, then the
    expected accepted, FA, FR in fixed point (fitness.EXPECTED_SCALE)."""
    _check_inputs(programs, split)
    k = len(programs)
    out = np.zeros((k, 6), dtype=np.int64)
    if k:
        _population_counts(programs.ops, programs.consts, programs.starts, programs.lengths,
                           programs.max_stack, split.X, split.rand, split.base, split.std_q,
                           out)
    return out


def population_thresholds(programs, split: SplitArrays) -> np.ndarray:
    _check_inputs(programs, split)
    out = np.empty((len(programs), split.n), dtype=np.float64)
    if len(programs):
        _population_thresholds(programs.ops, programs.consts, programs.starts,
                               programs.lengths, programs.max_stack, split.X, out)
    return out


@njit(cache=True, nogil=True)
def _threshold_counts(h, rand, base, std_q, out):
    acc = np.zeros(6, dtype=np.int64)
    _tally(h, 0, h.shape[0], rand, base, std_q, acc)
    for c in range(6):
        out[c] = acc[c]


def threshold_counts(h: np.ndarray, split: SplitArrays) -> Counts:
    """Counts of a threshold array (the same tally as the population kernel)."""
    h = np.ascontiguousarray(np.broadcast_to(np.asarray(h, dtype=np.float64), (split.n,)))
    out = np.zeros(6, dtype=np.int64)
    _threshold_counts(h, split.rand, split.base, split.std_q, out)
    return Counts.from_raw(split.n, out)
