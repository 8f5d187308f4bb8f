"""Every Numba kernel of the harness.

Public wrappers check and prepare arrays, then call private ``_kernels`` that
never raise. Numba is imported here only, so commands that do not evaluate
anything start fast.

The population kernel interprets linearised programs (see ``treeio.linearise``)
over a split: threads over programs (``kernels.threads``), row tiles inside, one small
value stack per program in L1; leaves feed the next instruction straight from
the input columns (see ``_interpret``). Each program's counts are accumulated
in row order, so results do not depend on the thread count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from evolve.kernels import threads
from evolve.lang import primitives as P
from evolve.objectives.metrics import EXPECTED_SCALE, Counts, quantise
from heuristics import ops as O

TILE = 1024   # rows per tile: the helpers below are calls, so a tile amortises them
# Programs per work item of the thread pool: a thread that finishes takes the
# next chunk, so programs of very different cost (or a core shared with another
# process) do not leave a thread idle at the end of a static split. Each
# program's counts are its own, so results do not depend on the schedule.
CHUNK = 4

# Opcodes as module constants, so Numba folds them.
OP_CONST = P.OP_CONST
ADD, SUB, MUL, PDIV = P.OP["add"], P.OP["sub"], P.OP["mul"], P.OP["pdiv"]
PMIN, PMAX, NEG, ABS = P.OP["pmin"], P.OP["pmax"], P.OP["neg"], P.OP["absf"]
PLOG, PEXP, PSQRT, SQUARE = P.OP["plog"], P.OP["pexp"], P.OP["psqrt"], P.OP["square"]
LT, ITE, AND, OR, NOT = P.OP["lt"], P.OP["ite"], P.OP["and_"], P.OP["or_"], P.OP["not_"]
DIV_EPS = O.DIV_EPS
# The interpreter tests opcode ranges: add..pmax are binary, neg..square unary,
# plog..psqrt have precomputed input columns (SplitArrays.derived).
if (ADD, SUB, MUL, PDIV, PMIN, PMAX) != tuple(range(ADD, ADD + 6)) or \
        (NEG, ABS, PLOG, PEXP, PSQRT, SQUARE) != tuple(range(NEG, NEG + 6)):
    raise ImportError("evolve.kernels: the opcode ranges of the primitive table changed")


# Index arithmetic: an array index Numba cannot prove non-negative gets a
# wrap-around test (negative indices count from the end) on every element,
# which stops LLVM from vectorising the loop. Offsets into the input columns
# are therefore cast to unsigned (``_u``); loop counters starting at 0 need no cast.
KERNEL = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


@njit(inline="always", **KERNEL)
def _u(i):
    return np.uint64(i)


@njit(inline="always", **KERNEL)
def _i(x):
    """x as int64: one type at every call of a helper, so each compiles once
    (a literal 0 or an int32 opcode would otherwise compile another copy)."""
    return np.int64(x)


@njit(inline="always", **KERNEL)
def _is_binary(op):
    return (ADD <= op <= PMAX) or op == LT or op == AND or op == OR


@njit(inline="always", **KERNEL)
def _is_unary(op):
    return (NEG <= op <= SQUARE) or op == NOT


@njit(**KERNEL)
def _binary(op, A, ar, ao, B, br, bo, D, dr, m):
    """D[dr, :m] = op(A[ar, ao:ao+m], B[br, bo:bo+m]); A holds the first argument.

    D's row may be A's or B's row (element-wise, each element read before written).
    """
    if op == ADD:
        for i in range(m):
            D[dr, i] = A[ar, _u(ao + i)] + B[br, _u(bo + i)]
    elif op == SUB:
        for i in range(m):
            D[dr, i] = A[ar, _u(ao + i)] - B[br, _u(bo + i)]
    elif op == MUL:
        for i in range(m):
            D[dr, i] = A[ar, _u(ao + i)] * B[br, _u(bo + i)]
    elif op == PDIV:
        for i in range(m):
            y = B[br, _u(bo + i)]
            D[dr, i] = A[ar, _u(ao + i)] / y if abs(y) > DIV_EPS else 1.0
    elif op == PMIN:
        for i in range(m):
            x = A[ar, _u(ao + i)]
            y = B[br, _u(bo + i)]
            D[dr, i] = x if x < y else y
    elif op == PMAX:
        for i in range(m):
            x = A[ar, _u(ao + i)]
            y = B[br, _u(bo + i)]
            D[dr, i] = x if x > y else y
    elif op == LT:
        for i in range(m):
            D[dr, i] = 1.0 if A[ar, _u(ao + i)] < B[br, _u(bo + i)] else 0.0
    elif op == AND:
        for i in range(m):
            D[dr, i] = 1.0 if (A[ar, _u(ao + i)] != 0.0) & (B[br, _u(bo + i)] != 0.0) else 0.0
    else:  # OR
        for i in range(m):
            D[dr, i] = 1.0 if (A[ar, _u(ao + i)] != 0.0) | (B[br, _u(bo + i)] != 0.0) else 0.0


@njit(**KERNEL)
def _unary(op, A, ar, ao, D, dr, m):
    """D[dr, :m] = op(A[ar, ao:ao+m]) (D may be A's row)."""
    if op == NEG:
        for i in range(m):
            D[dr, i] = -A[ar, _u(ao + i)]
    elif op == ABS:
        for i in range(m):
            D[dr, i] = abs(A[ar, _u(ao + i)])
    elif op == PLOG:                 # heuristics.ops' own log and exp: vector code
        for i in range(m):
            D[dr, i] = O.plog(A[ar, _u(ao + i)])
    elif op == PEXP:
        for i in range(m):
            D[dr, i] = O.pexp(A[ar, _u(ao + i)])
    elif op == PSQRT:
        for i in range(m):
            D[dr, i] = math.sqrt(abs(A[ar, _u(ao + i)]))
    elif op == SQUARE:
        for i in range(m):
            x = A[ar, _u(ao + i)]
            D[dr, i] = x * x
    else:  # NOT
        for i in range(m):
            D[dr, i] = 0.0 if A[ar, _u(ao + i)] != 0.0 else 1.0


@njit(**KERNEL)
def _ite(C, cr, co, S, ar, br, dr, m):
    """S[dr, :m] = S[ar, :m] where C[cr, co:co+m] is true, else S[br, :m] (ite(c, a, b))."""
    for i in range(m):
        S[dr, i] = S[ar, i] if C[cr, _u(co + i)] != 0.0 else S[br, i]


@njit(**KERNEL)
def _source(ops, consts, k, end, X, U, use_u, r0, m, stack, row):
    """The leaf at ops[k] as a source ``(matrix, row, column offset)`` plus how many
    instructions it covers and whether it already sits in the stack.

    - an input: its column of X (1 instruction);
    - an input under plog/pexp/psqrt: its precomputed column of U (2);
    - a constant, folded through the unary ops that follow it (computed once on a
      single element by the same loop, so bit for bit what the tile would get),
      then spread into stack[row] (1 + the folded ops).
    """
    op = ops[k]
    if op < OP_CONST:
        if use_u and k + 1 < end and PLOG <= ops[k + 1] <= PSQRT:
            return U, (ops[k + 1] - PLOG) * X.shape[0] + op, r0, 2, False
        return X, op, r0, 1, False
    stack[row, 0] = consts[k]
    w = 1
    while k + w < end and _is_unary(ops[k + w]):
        _unary(_i(ops[k + w]), stack, _i(row), _i(0), stack, _i(row), _i(1))
        w += 1
    c = stack[row, 0]
    for i in range(m):
        stack[row, i] = c
    return stack, row, 0, w, True


@njit(inline="always", **KERNEL)
def _swap(slot, j, spare):
    """Stack slot j now holds the spare row (just written); its old row is the spare."""
    old = slot[j]
    slot[j] = spare
    return old


@njit(**KERNEL)
def _interpret(ops, consts, start, length, X, U, use_u, r0, m, stack, slot):
    """Evaluate one program on rows r0..r0+m; returns the stack row holding the result.

    A stack machine over row tiles. A leaf is not copied onto the stack when the
    next instruction consumes it: ``leaf, op`` and ``leaf, leaf, binary op`` run as
    one pass over the tile, reading inputs straight from X (or, with ``use_u``,
    plog/pexp/psqrt of an input from U, see ``SplitArrays.derived``). Constants are
    folded through the unary ops above them. Every formula is the one of
    heuristics/ops.py, element by element, so results do not change.

    Stack slots are renamed rows: slot[j] is the row of stack slot j and one row
    (``spare``) is free, so stack has one row more than the program's depth. Every
    instruction writes the spare row, never a row it reads, and the slot it fills
    takes that row: no element loop writes an array it reads, so LLVM's overlap
    checks pass and the loops run as vector instructions (an in-place loop fails
    them and runs one element at a time).
    """
    spare = stack.shape[0] - 1
    for j in range(spare + 1):
        slot[j] = j
    sp = 0
    k = start
    end = start + length
    while k < end:
        op = ops[k]
        if op <= OP_CONST:
            A, ar, ao, w, in_stack = _source(ops, consts, k, end, X, U, use_u, r0, m, stack,
                                             _i(slot[sp]))
            k += w
            nxt = ops[k] if k < end else -1
            if _is_binary(nxt):
                # ops: [..., b, leaf, op]: the leaf is the first argument
                _binary(_i(nxt), A, ar, ao, stack, _i(slot[sp - 1]), _i(0), stack,
                        _i(spare), m)
                spare = _swap(slot, sp - 1, spare)
                k += 1
                continue
            if _is_unary(nxt):
                _unary(_i(nxt), A, ar, ao, stack, _i(slot[sp]), m)
                sp += 1
                k += 1
                continue
            if nxt == ITE:
                # ops: [..., b, a, leaf, ite]: the leaf is the condition
                _ite(A, ar, ao, stack, _i(slot[sp - 1]), _i(slot[sp - 2]), _i(spare), m)
                spare = _swap(slot, sp - 2, spare)
                sp -= 1
                k += 1
                continue
            if 0 <= nxt <= OP_CONST:
                # ops: [leaf b, leaf a, op]: the second argument comes first
                B, br, bo, w2, _ = _source(ops, consts, k, end, X, U, use_u, r0, m, stack,
                                           _i(slot[sp + 1]))
                if k + w2 < end and _is_binary(ops[k + w2]):
                    _binary(_i(ops[k + w2]), B, br, bo, A, ar, ao, stack, _i(spare), m)
                    spare = _swap(slot, sp, spare)
                    sp += 1
                    k += w2 + 1
                    continue
            if not in_stack:
                d = slot[sp]
                for i in range(m):
                    stack[d, i] = A[ar, _u(ao + i)]
            sp += 1
        elif _is_binary(op):
            _binary(_i(op), stack, _i(slot[sp - 1]), _i(0), stack, _i(slot[sp - 2]), _i(0),
                    stack, _i(spare), m)
            spare = _swap(slot, sp - 2, spare)
            sp -= 1
            k += 1
        elif _is_unary(op):
            _unary(_i(op), stack, _i(slot[sp - 1]), _i(0), stack, _i(spare), m)
            spare = _swap(slot, sp - 1, spare)
            k += 1
        else:  # ITE: ops [..., b, a, c, ite]
            _ite(stack, _i(slot[sp - 1]), _i(0), stack, _i(slot[sp - 2]), _i(slot[sp - 3]),
                 _i(spare), m)
            spare = _swap(slot, sp - 3, spare)
            sp -= 2
            k += 1
    return slot[0]


def stack_rows(max_stack: int) -> int:
    """Rows of the stack ``_interpret`` needs for programs of depth ``max_stack``."""
    return max_stack + 1


@njit(**KERNEL)
def run_program(ops, consts, start, length, X, r0, m, stack, slot):
    """Evaluate one program on rows r0..r0+m of X; returns the stack row holding the
    result. (``_interpret`` without precomputed columns, for kernels over other
    matrices; stack has max_stack + 1 rows, slot as many entries.)"""
    return _interpret(ops, consts, start, length, X, X, False, r0, m, stack, slot)


@njit(**KERNEL)
def _derived_columns(X, U):
    """U[(op - PLOG) * n_inputs + j] = op(X[j]) for op in plog, pexp, psqrt."""
    nin = X.shape[0]
    for op in range(PLOG, PSQRT + 1):
        for j in range(nin):
            _unary(op, X, j, _i(0), U, (op - PLOG) * nin + j, X.shape[1])


@njit(inline="always", **KERNEL)
def _tally(H, hr, j0, m, rand, base, std_q, acc):
    """Add the decisions and expected sums of thresholds H[hr, :m] (rows j0..) to acc.

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
        x = H[hr, i]
        j = _u(j0 + i)
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
    stack = np.empty((max_stack + 1, TILE), dtype=np.float64)
    slot = np.empty(max_stack + 1, dtype=np.int64)
    acc = np.zeros(6, dtype=np.int64)
    for p in range(i0 * CHUNK, min(starts.shape[0], i1 * CHUNK)):
        acc[:] = 0
        for r0 in range(0, n, TILE):
            m = min(TILE, n - r0)
            row = _interpret(ops, consts, starts[p], lengths[p], X, U, True, r0, m, stack, slot)
            _tally(stack, row, r0, m, rand, base, std_q, acc)
        for c in range(6):
            out[p, c] = acc[c]


@njit(**KERNEL)
def _population_thresholds(i0, i1, ops, consts, starts, lengths, max_stack, X, U, out):
    """Thresholds of the programs of work items i0..i1 (CHUNK programs an item)."""
    n = X.shape[1]
    stack = np.empty((max_stack + 1, TILE), dtype=np.float64)
    slot = np.empty(max_stack + 1, dtype=np.int64)
    for p in range(i0 * CHUNK, min(starts.shape[0], i1 * CHUNK)):
        for r0 in range(0, n, TILE):
            m = min(TILE, n - r0)
            row = _interpret(ops, consts, starts[p], lengths[p], X, U, True, r0, m, stack, slot)
            for i in range(m):
                out[p, _u(r0 + i)] = stack[row, i]


class SplitArrays:
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
        threads.run(_population_counts, -(-k // CHUNK), programs.ops, programs.consts,
                    programs.starts, programs.lengths, programs.max_stack, split.X,
                    _derived_of(split), split.rand, split.base, split.std_q, out)
    return out


def population_thresholds(programs, split: SplitArrays) -> np.ndarray:
    _check_inputs(programs, split)
    out = np.empty((len(programs), split.n), dtype=np.float64)
    if len(programs):
        threads.run(_population_thresholds, -(-len(programs) // CHUNK), programs.ops,
                    programs.consts, programs.starts, programs.lengths, programs.max_stack,
                    split.X, _derived_of(split), out)
    return out


@njit(cache=True, nogil=True)
def _threshold_counts(h, rand, base, std_q, out):
    acc = np.zeros(6, dtype=np.int64)
    _tally(h.reshape(1, h.shape[0]), 0, 0, h.shape[0], rand, base, std_q, acc)
    for c in range(6):
        out[c] = acc[c]


def threshold_counts(h: np.ndarray, split: SplitArrays) -> Counts:
    """Counts of a threshold array (the same tally as the population kernel)."""
    h = np.ascontiguousarray(np.broadcast_to(np.asarray(h, dtype=np.float64), (split.n,)))
    out = np.zeros(6, dtype=np.int64)
    _threshold_counts(h, split.rand, split.base, split.std_q, out)
    return Counts.from_raw(split.n, out)
