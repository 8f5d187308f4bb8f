"""The population kernels over token splits: counts and thresholds of every program.

Public wrappers check and prepare arrays, then call private ``_kernels`` that
never raise. Numba is imported by the kernel modules only, so commands that do not
evaluate anything start fast.

The population kernel interprets linearised programs (see ``treeio.linearise``)
over a split: threads over programs (``kernels.threads``), row tiles inside, one
small value stack per program in L1; leaves feed the next instruction straight
from the input columns (see ``interpreter.interpret``). Each program's counts are
accumulated in row order, so results do not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from evolve.kernels import threads
from evolve.kernels.interpreter import (KERNEL, OP_CONST, PLOG, PSQRT, i64, interpret,
                                        new_stack, u, unary)
from evolve.lang.features import ALL_INPUT_NAMES
from evolve.kernels.layout import EXPECTED_SCALE, quantise

TILE = 1024   # rows per tile: the helpers below are calls, so a tile amortises them
# Programs per work item of the thread pool: a thread that finishes takes the
# next chunk, so programs of very different cost (or a core shared with another
# process) do not leave a thread idle at the end of a static split. Each
# program's counts are its own, so results do not depend on the schedule.
CHUNK = 4


@njit(**KERNEL)
def _derived_columns(X, U):
    """U[(op - PLOG) * n_inputs + j] = op(X[j]) for op in plog, pexp, psqrt."""
    nin = X.shape[0]
    for op in range(PLOG, PSQRT + 1):
        for j in range(nin):
            unary(op, X, j, i64(0), U, (op - PLOG) * nin + j, X.shape[1])


@njit(inline="always", **KERNEL)
def _tally(H, hr, j0, m, rand, base, std_q, acc):
    """Add the decisions and expected sums of thresholds H[hr, :m] (rows j0..) to acc.

    acc[0:3]: accepted, false accepts, false rejects; acc[3:6]: expected accepted,
    FA and FR in fixed point (see layout.EXPECTED_SCALE). Integer sums are exact
    and order-free, so every caller agrees to the bit.
    """
    a0 = 0
    a1 = 0
    a2 = 0
    e0 = 0
    e1 = 0
    e2 = 0
    for i in range(m):
        x = H[hr, i]
        j = u(j0 + i)
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


@njit(**KERNEL)
def _population_counts(i0, i1, ops, consts, starts, lengths, max_stack, X, U, rand, base,
                       std_q, out):
    """Counts of the programs of work items i0..i1 (CHUNK programs an item)."""
    n = X.shape[1]
    stack, slot = new_stack(max_stack, TILE)
    acc = np.zeros(6, dtype=np.int64)
    for p in range(i0 * CHUNK, min(starts.shape[0], i1 * CHUNK)):
        acc[:] = 0
        for r0 in range(0, n, TILE):
            m = min(TILE, n - r0)
            row = interpret(ops, consts, starts[p], lengths[p], X, U, True, r0, m, stack, slot)
            _tally(stack, row, r0, m, rand, base, std_q, acc)
        for c in range(6):
            out[p, c] = acc[c]


@njit(**KERNEL)
def _population_thresholds(i0, i1, ops, consts, starts, lengths, max_stack, X, U, out):
    """Thresholds of the programs of work items i0..i1 (CHUNK programs an item)."""
    n = X.shape[1]
    stack, slot = new_stack(max_stack, TILE)
    for p in range(i0 * CHUNK, min(starts.shape[0], i1 * CHUNK)):
        for r0 in range(0, n, TILE):
            m = min(TILE, n - r0)
            row = interpret(ops, consts, starts[p], lengths[p], X, U, True, r0, m, stack, slot)
            for i in range(m):
                out[p, u(r0 + i)] = stack[row, i]


class TokenArrays:
    """A split prepared once for the kernels: contiguous columns, quantised std."""

    def __init__(self, ds):
        self.n = len(ds)
        self.X = ds.feature_matrix()
        self.rand = np.ascontiguousarray(ds.rand_value, dtype=np.float64)
        self.base = np.ascontiguousarray(ds.baseline_accepts, dtype=np.bool_)
        self.std_q = quantise(ds.standard_threshold())
        self._derived = None

    @property
    def derived(self) -> np.ndarray:
        """plog, pexp and psqrt of every input column (made on first use): the
        population kernels read these instead of recomputing them per program."""
        if self._derived is None:
            self._derived = derived_columns(self.X)
        return self._derived


def derived_columns(X: np.ndarray) -> np.ndarray:
    """plog, pexp and psqrt of every row of a feature matrix, (3 * inputs, rows)."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    U = np.empty((3 * X.shape[0], X.shape[1]), dtype=np.float64)
    _derived_columns(X, U)
    return U


def _derived_of(split) -> np.ndarray:
    derived = getattr(split, "derived", None)     # any object with X works too
    return derived if derived is not None else derived_columns(split.X)


def _check_inputs(programs, split: TokenArrays) -> None:
    """Programs may only load inputs the split has (the kernel never checks)."""
    _check_loads(programs, split.X.shape[0])


def _check_loads(programs, n_inputs: int) -> None:
    loads = programs.ops[programs.ops < OP_CONST]
    if loads.size and int(loads.max()) >= n_inputs:
        top = int(loads.max())
        name = ALL_INPUT_NAMES[top] if top < len(ALL_INPUT_NAMES) else "?"
        raise ValueError(f"a program reads input '{name}', which this split does not have")


def population_counts(programs, split: TokenArrays) -> np.ndarray:
    """Counts for every program, int64 (P, 6): accepted, FA, FR, then the
    expected accepted, FA, FR in fixed point (layout.EXPECTED_SCALE)."""
    _check_inputs(programs, split)
    k = len(programs)
    out = np.zeros((k, 6), dtype=np.int64)
    if k:
        threads.run(_population_counts, -(-k // CHUNK), programs.ops, programs.consts,
                    programs.starts, programs.lengths, programs.max_stack, split.X,
                    _derived_of(split), split.rand, split.base, split.std_q, out)
    return out


def population_thresholds(programs, split: TokenArrays) -> np.ndarray:
    """Every program's threshold on every row of a token split, (P, n)."""
    return matrix_thresholds(programs, split.X, split.derived)


def matrix_thresholds(programs, X: np.ndarray, derived: np.ndarray | None = None) -> np.ndarray:
    """Every program's threshold on every column of an input matrix (one row per
    input, as ``TokenArrays.X`` or ``spec.TraceArrays.X``), (P, columns); ``derived``:
    its ``derived_columns`` when already made."""
    _check_loads(programs, X.shape[0])
    out = np.empty((len(programs), X.shape[1]), dtype=np.float64)
    if len(programs):
        threads.run(_population_thresholds, -(-len(programs) // CHUNK), programs.ops,
                    programs.consts, programs.starts, programs.lengths, programs.max_stack,
                    X, derived_columns(X) if derived is None else derived, out)
    return out


@njit(cache=True, nogil=True)
def _threshold_counts(h, rand, base, std_q, out):
    acc = np.zeros(6, dtype=np.int64)
    _tally(h.reshape(1, h.shape[0]), 0, 0, h.shape[0], rand, base, std_q, acc)
    for c in range(6):
        out[c] = acc[c]


def threshold_tally(h: np.ndarray, split: TokenArrays) -> np.ndarray:
    """The counts row of a threshold array, int64 (6,) as in ``population_counts``
    (the same tally as the population kernel)."""
    h = np.ascontiguousarray(np.broadcast_to(np.asarray(h, dtype=np.float64), (split.n,)))
    out = np.zeros(6, dtype=np.int64)
    _threshold_counts(h, split.rand, split.base, split.std_q, out)
    return out
