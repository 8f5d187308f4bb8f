"""The interpreter of linearised programs (``treeio.linearise``) over row tiles.

``interpret`` evaluates one program on a tile of rows of an input matrix (one row
per input, opcode = row index) with a small value stack of rows; the population
kernels (``kernels.tokens``, ``kernels.speculative``) call it per program and tile.
Every formula is the one of heuristics/ops.py, element by element; every element
loop runs as vector code (see ``interpret`` on why no loop writes a row it reads).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from evolve.lang import primitives as P
from heuristics import ops as O

# Opcodes as module constants, so Numba folds them.
OP_CONST = P.OP_CONST
ADD, SUB, MUL, PDIV = P.OP["add"], P.OP["sub"], P.OP["mul"], P.OP["pdiv"]
PMIN, PMAX, NEG, ABS = P.OP["pmin"], P.OP["pmax"], P.OP["neg"], P.OP["absf"]
PLOG, PEXP, PSQRT, SQUARE = P.OP["plog"], P.OP["pexp"], P.OP["psqrt"], P.OP["square"]
LT, ITE, AND, OR, NOT = P.OP["lt"], P.OP["ite"], P.OP["and_"], P.OP["or_"], P.OP["not_"]
DIV_EPS = O.DIV_EPS
# The interpreter tests opcode ranges: add..pmax are binary, neg..square unary,
# plog..psqrt have precomputed input columns (TokenArrays.derived).
if (ADD, SUB, MUL, PDIV, PMIN, PMAX) != tuple(range(ADD, ADD + 6)) or \
        (NEG, ABS, PLOG, PEXP, PSQRT, SQUARE) != tuple(range(NEG, NEG + 6)):
    raise ImportError("evolve.kernels.interpreter: the opcode ranges of the primitive table changed")


# Index arithmetic: an array index Numba cannot prove non-negative gets a
# wrap-around test (negative indices count from the end) on every element,
# which stops LLVM from vectorising the loop. Offsets into the input columns
# are therefore cast to unsigned (``u``); loop counters starting at 0 need no cast.
KERNEL = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


@njit(inline="always", **KERNEL)
def u(i):
    return np.uint64(i)


@njit(inline="always", **KERNEL)
def i64(x):
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
    ``interpret`` never passes a D row that is one of the argument rows."""
    if op == ADD:
        for i in range(m):
            D[dr, i] = A[ar, u(ao + i)] + B[br, u(bo + i)]
    elif op == SUB:
        for i in range(m):
            D[dr, i] = A[ar, u(ao + i)] - B[br, u(bo + i)]
    elif op == MUL:
        for i in range(m):
            D[dr, i] = A[ar, u(ao + i)] * B[br, u(bo + i)]
    elif op == PDIV:
        for i in range(m):
            y = B[br, u(bo + i)]
            D[dr, i] = A[ar, u(ao + i)] / y if abs(y) > DIV_EPS else 1.0
    elif op == PMIN:
        for i in range(m):
            x = A[ar, u(ao + i)]
            y = B[br, u(bo + i)]
            D[dr, i] = x if x < y else y
    elif op == PMAX:
        for i in range(m):
            x = A[ar, u(ao + i)]
            y = B[br, u(bo + i)]
            D[dr, i] = x if x > y else y
    elif op == LT:
        for i in range(m):
            D[dr, i] = 1.0 if A[ar, u(ao + i)] < B[br, u(bo + i)] else 0.0
    elif op == AND:
        for i in range(m):
            D[dr, i] = 1.0 if (A[ar, u(ao + i)] != 0.0) & (B[br, u(bo + i)] != 0.0) else 0.0
    else:  # OR
        for i in range(m):
            D[dr, i] = 1.0 if (A[ar, u(ao + i)] != 0.0) | (B[br, u(bo + i)] != 0.0) else 0.0


@njit(**KERNEL)
def unary(op, A, ar, ao, D, dr, m):
    """D[dr, :m] = op(A[ar, ao:ao+m]) (D may be A's row)."""
    if op == NEG:
        for i in range(m):
            D[dr, i] = -A[ar, u(ao + i)]
    elif op == ABS:
        for i in range(m):
            D[dr, i] = abs(A[ar, u(ao + i)])
    elif op == PLOG:                 # heuristics.ops' own log and exp: vector code
        for i in range(m):
            D[dr, i] = O.plog(A[ar, u(ao + i)])
    elif op == PEXP:
        for i in range(m):
            D[dr, i] = O.pexp(A[ar, u(ao + i)])
    elif op == PSQRT:
        for i in range(m):
            D[dr, i] = math.sqrt(abs(A[ar, u(ao + i)]))
    elif op == SQUARE:
        for i in range(m):
            x = A[ar, u(ao + i)]
            D[dr, i] = x * x
    else:  # NOT
        for i in range(m):
            D[dr, i] = 0.0 if A[ar, u(ao + i)] != 0.0 else 1.0


@njit(**KERNEL)
def _ite(C, cr, co, S, ar, br, dr, m):
    """S[dr, :m] = S[ar, :m] where C[cr, co:co+m] is true, else S[br, :m] (ite(c, a, b))."""
    for i in range(m):
        S[dr, i] = S[ar, i] if C[cr, u(co + i)] != 0.0 else S[br, i]


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
        unary(i64(ops[k + w]), stack, i64(row), i64(0), stack, i64(row), i64(1))
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
def interpret(ops, consts, start, length, X, U, use_u, r0, m, stack, slot):
    """Evaluate one program on rows r0..r0+m; returns the stack row holding the result.

    A stack machine over row tiles. A leaf is not copied onto the stack when the
    next instruction consumes it: ``leaf, op`` and ``leaf, leaf, binary op`` run as
    one pass over the tile, reading inputs straight from X (or, with ``use_u``,
    plog/pexp/psqrt of an input from U, see ``TokenArrays.derived``). Constants are
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
                                             i64(slot[sp]))
            k += w
            nxt = ops[k] if k < end else -1
            if _is_binary(nxt):
                # ops: [..., b, leaf, op]: the leaf is the first argument
                _binary(i64(nxt), A, ar, ao, stack, i64(slot[sp - 1]), i64(0), stack,
                        i64(spare), m)
                spare = _swap(slot, sp - 1, spare)
                k += 1
                continue
            if _is_unary(nxt):
                unary(i64(nxt), A, ar, ao, stack, i64(slot[sp]), m)
                sp += 1
                k += 1
                continue
            if nxt == ITE:
                # ops: [..., b, a, leaf, ite]: the leaf is the condition
                _ite(A, ar, ao, stack, i64(slot[sp - 1]), i64(slot[sp - 2]), i64(spare), m)
                spare = _swap(slot, sp - 2, spare)
                sp -= 1
                k += 1
                continue
            if 0 <= nxt <= OP_CONST:
                # ops: [leaf b, leaf a, op]: the second argument comes first
                B, br, bo, w2, _ = _source(ops, consts, k, end, X, U, use_u, r0, m, stack,
                                           i64(slot[sp + 1]))
                if k + w2 < end and _is_binary(ops[k + w2]):
                    _binary(i64(ops[k + w2]), B, br, bo, A, ar, ao, stack, i64(spare), m)
                    spare = _swap(slot, sp, spare)
                    sp += 1
                    k += w2 + 1
                    continue
            if not in_stack:
                d = slot[sp]
                for i in range(m):
                    stack[d, i] = A[ar, u(ao + i)]
            sp += 1
        elif _is_binary(op):
            _binary(i64(op), stack, i64(slot[sp - 1]), i64(0), stack, i64(slot[sp - 2]), i64(0),
                    stack, i64(spare), m)
            spare = _swap(slot, sp - 2, spare)
            sp -= 1
            k += 1
        elif _is_unary(op):
            unary(i64(op), stack, i64(slot[sp - 1]), i64(0), stack, i64(spare), m)
            spare = _swap(slot, sp - 1, spare)
            k += 1
        else:  # ITE: ops [..., b, a, c, ite]
            _ite(stack, i64(slot[sp - 1]), i64(0), stack, i64(slot[sp - 2]), i64(slot[sp - 3]),
                 i64(spare), m)
            spare = _swap(slot, sp - 3, spare)
            sp -= 2
            k += 1
    return slot[0]


@njit(**KERNEL)
def new_stack(max_stack, width):
    """The (stack, slot) arrays ``interpret`` needs for programs of depth up to
    ``max_stack`` over tiles of ``width`` rows: one row more than the depth (the
    spare row of the renamed slots)."""
    return (np.empty((max_stack + 1, width), dtype=np.float64),
            np.empty(max_stack + 1, dtype=np.int64))


@njit(**KERNEL)
def run_program(ops, consts, start, length, X, r0, m, stack, slot):
    """Evaluate one program on rows r0..r0+m of X; returns the stack row holding the
    result. (``interpret`` without precomputed columns, for kernels over other
    matrices; stack and slot from ``new_stack``.)"""
    return interpret(ops, consts, start, length, X, X, False, r0, m, stack, slot)
