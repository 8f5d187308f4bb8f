"""The interpreter of linearised programs (``treeio.linearise``) in torch, and the
primitive set as torch operations, bit for bit those of ``evolve.kernels.interpreter``.

Every formula is the one of ``heuristics/ops.py``, written as one torch operation per
arithmetic step (never a fused multiply-add, which rounds once where the Numba
kernels round twice), in the same order: IEEE addition, subtraction,
multiplication, division and square root are correctly rounded on every device, so
each step gives the same bits. ``exp_poly`` and ``log_poly`` are the module's own
(``torch.round`` rounds half to even, as ``np.rint``; the bit manipulation goes
through ``Tensor.view(torch.int64)``); the protected operators and comparisons keep
their NaN meaning (``pmin(a, b) = a if a < b else b`` is a ``where``, not
``torch.minimum``, which propagates NaN). The code is device-agnostic.

A program runs over the columns of an input matrix ``X`` (one row per input,
opcode = row index; any number of inputs). Constants stay one-element tensors until
an input meets them (a folded constant is the same bits as the Numba kernel's, which
folds them element by element too).
"""

from __future__ import annotations

import torch

from evolve.lang import primitives as P
from heuristics import ops as O

OP_CONST = P.OP_CONST
ADD, SUB, MUL, PDIV = P.OP["add"], P.OP["sub"], P.OP["mul"], P.OP["pdiv"]
PMIN, PMAX, NEG, ABS = P.OP["pmin"], P.OP["pmax"], P.OP["neg"], P.OP["absf"]
PLOG, PEXP, PSQRT, SQUARE = P.OP["plog"], P.OP["pexp"], P.OP["psqrt"], P.OP["square"]
LT, ITE, AND, OR, NOT = P.OP["lt"], P.OP["ite"], P.OP["and_"], P.OP["or_"], P.OP["not_"]
if (PLOG, PEXP, PSQRT) != (PLOG, PLOG + 1, PLOG + 2):
    raise ImportError("evolve.kernels.gpu.interp: plog, pexp, psqrt are no longer consecutive")

_MANTISSA = int(O._MANTISSA)
_EXPONENT_ONE = int(O._EXPONENT_ONE)
_EXP_POLY = (O.E3, O.E4, O.E5, O.E6, O.E7, O.E8, O.E9, O.E10, O.E11, O.E12)
_LOG_POLY = (O.L1, O.L2, O.L3, O.L4, O.L5, O.L6, O.L7, O.L8, O.L9)


def _float_of(bits: torch.Tensor) -> torch.Tensor:
    return bits.view(torch.float64)


def exp_poly(x: torch.Tensor) -> torch.Tensor:
    """heuristics.ops.exp_poly, step by step."""
    x = torch.where(x < O.EXP_LO, O.EXP_LO, torch.where(x > O.EXP_HI, O.EXP_HI, x))
    k = torch.round(x * O.INV_LN2)
    r = (x - k * O.LN2_HI) - k * O.LN2_LO
    acc = r * O.E13                                   # E12 + r * E13, then inwards out
    acc = O.E12 + acc
    for c in reversed(_EXP_POLY[:-1]):                # E11 .. E3
        acc = c + r * acc
    p = r * (O.E2 + r * acc)
    y = 1.0 + (r + r * p)
    ki = torch.nan_to_num(k, nan=0.0).to(torch.int64)  # NaN is the caller's (pexp)
    k1 = torch.bitwise_right_shift(ki, 1)
    f1 = _float_of(torch.bitwise_left_shift(k1 + 1023, 52))
    f2 = _float_of(torch.bitwise_left_shift((ki - k1) + 1023, 52))
    return (y * f1) * f2


def log_poly(x: torch.Tensor) -> torch.Tensor:
    """heuristics.ops.log_poly, step by step."""
    b = x.contiguous().view(torch.int64)
    m = _float_of(torch.bitwise_or(torch.bitwise_and(b, _MANTISSA), _EXPONENT_ONE))
    big = m > O.SQRT2
    m = torch.where(big, m * 0.5, m)
    e = (torch.bitwise_right_shift(b, 52) - 1023).to(torch.float64) + big.to(torch.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    acc = z * O.L10
    acc = O.L9 + acc
    for c in reversed(_LOG_POLY[:-1]):                # L8 .. L1
        acc = c + z * acc
    R = z * acc
    y = e * O.LN2_HI + (f - (s * (f - R) - e * O.LN2_LO))
    return torch.where(x == float("inf"), x, y)


_M27 = (1 << 27) - 1
_M54 = (1 << 54) - 1
_TINY = 2.0 ** -1000


def _square_hi(t: torch.Tensor) -> torch.Tensor:
    """floor(t^2 / 2^54) and whether t^2 mod 2^54 is 0, for odd int64 t < 2^54 (its
    square is odd, so never 0 mod 2^54): the high part of an exact 108-bit square."""
    t1, t0 = torch.bitwise_right_shift(t, 27), torch.bitwise_and(t, _M27)
    mid = 2 * t1 * t0
    low = torch.bitwise_and(mid, _M27) * (1 << 27) + t0 * t0
    return t1 * t1 + torch.bitwise_right_shift(mid, 27) + torch.bitwise_right_shift(low, 54)


def sqrt_rn(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of x >= 0 (as ``math.sqrt`` and IEEE hardware;
    torch's CPU sqrt is only faithful): torch's sqrt, then one exact correction.

    x is scaled by an even power of two into [1, 4), where sqrt(x) is in [1, 2) and
    s = S 2^-52; the nearest double is s + 2^-52 when 4 x 2^104 > (2S + 1)^2, and
    s - 2^-52 when 4 x 2^104 < (2S - 1)^2 (int64 arithmetic on 27-bit halves, exact).
    """
    tiny = x < _TINY
    xs = torch.where(tiny, x * 2.0 ** 200, x)                 # subnormals: exact scaling
    bits = xs.contiguous().view(torch.int64)
    e = torch.bitwise_right_shift(bits, 52) - 1023
    j = torch.div(e, 2, rounding_mode="floor").clamp(-511, 511)
    scale = _float_of(torch.bitwise_left_shift(1023 - 2 * j, 52))    # 2^-2j
    xr = xs * scale                                                   # in [1, 4)
    s = torch.sqrt(xr).clamp(1.0, 2.0 - 2.0 ** -52)
    S = torch.bitwise_or(torch.bitwise_and(s.view(torch.int64), _MANTISSA), 1 << 52)
    xb = xr.view(torch.int64)
    X = torch.bitwise_or(torch.bitwise_and(xb, _MANTISSA), 1 << 52)
    A = torch.where(torch.bitwise_right_shift(xb, 52) > 1023, 2 * X, X)   # 4 x 2^104 / 2^54
    up = A > _square_hi(2 * S + 1)
    down = A <= _square_hi(2 * S - 1)
    y = (S + up.to(torch.int64) - down.to(torch.int64)).to(torch.float64) * 2.0 ** -52
    y = y * _float_of(torch.bitwise_left_shift(j + 1023, 52))          # * 2^j, exact
    y = torch.where(tiny, y * 2.0 ** -100, y)
    special = (x == 0.0) | (x == float("inf")) | (x != x)
    return torch.where(special, torch.sqrt(x), y)


def plog(a: torch.Tensor) -> torch.Tensor:
    x = torch.abs(a)
    return torch.where(x > O.LOG_EPS, log_poly(x), O.LOG_FLOOR)


def pexp(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a < O.EXP_MAX, exp_poly(a), O.EXP_CAP)


def unary(op: int, a: torch.Tensor) -> torch.Tensor:
    if op == NEG:
        return torch.neg(a)
    if op == ABS:
        return torch.abs(a)
    if op == PLOG:
        return plog(a)
    if op == PEXP:
        return pexp(a)
    if op == PSQRT:
        return sqrt_rn(torch.abs(a))
    if op == SQUARE:
        return a * a
    if op == NOT:
        return (a == 0.0).to(torch.float64)
    raise ValueError(f"opcode {op} is not a unary primitive")


def binary(op: int, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b); a is the first argument."""
    if op == ADD:
        return a + b
    if op == SUB:
        return a - b
    if op == MUL:
        return a * b
    if op == PDIV:
        return torch.where(torch.abs(b) > O.DIV_EPS, a / b, 1.0)
    if op == PMIN:
        return torch.where(a < b, a, b)
    if op == PMAX:
        return torch.where(a > b, a, b)
    if op == LT:
        return (a < b).to(torch.float64)
    if op == AND:
        return ((a != 0.0) & (b != 0.0)).to(torch.float64)
    if op == OR:
        return ((a != 0.0) | (b != 0.0)).to(torch.float64)
    raise ValueError(f"opcode {op} is not a binary primitive")


_UNARY = {NEG, ABS, PLOG, PEXP, PSQRT, SQUARE, NOT}
_BINARY = {ADD, SUB, MUL, PDIV, PMIN, PMAX, LT, AND, OR}


def derived(X: torch.Tensor) -> torch.Tensor:
    """plog, pexp and psqrt of every input row of X, (3 * inputs, columns), in the order
    of ``kernels.tokens.derived_columns`` (elementwise: the bits ``run`` would compute)."""
    return torch.cat([plog(X), pexp(X), sqrt_rn(torch.abs(X))])


def run(ops, consts, X: torch.Tensor, U: torch.Tensor | None = None) -> torch.Tensor:
    """One program (opcodes and constants of ``treeio.linearise``, reversed prefix
    order) over the columns of X: the values, (X.shape[1],) float64 on X's device.
    With ``U`` (``derived(X)``), plog, pexp and psqrt of an input are read from it."""
    stack = []
    one = None
    k, end = 0, len(ops)
    while k < end:
        op = ops[k]
        if op < OP_CONST:
            nxt = ops[k + 1] if k + 1 < end else -1
            if U is not None and PLOG <= nxt <= PSQRT:
                stack.append(U[(nxt - PLOG) * X.shape[0] + op])
                k += 2
                continue
            stack.append(X[op])
        elif op == OP_CONST:
            if one is None:
                one = torch.empty(1, dtype=torch.float64, device=X.device)
            stack.append(one.new_full((1,), consts[k]))
        elif op in _BINARY:
            a = stack.pop()
            stack[-1] = binary(op, a, stack[-1])
        elif op in _UNARY:
            stack[-1] = unary(op, stack[-1])
        elif op == ITE:               # ops [..., b, a, c, ite]
            cond = stack.pop()
            a = stack.pop()
            stack[-1] = torch.where(cond != 0.0, a, stack[-1])
        else:
            raise ValueError(f"unknown opcode {op}")
        k += 1
    out = stack[0]
    return out.expand(X.shape[1]) if out.shape[0] != X.shape[1] else out


def program_lists(programs) -> list:
    """Each program of ``programs`` (``treeio.Programs``) as (opcodes, constants) lists."""
    ops, consts = programs.ops.tolist(), programs.consts.tolist()
    return [(ops[s:s + n], consts[s:s + n])
            for s, n in zip(programs.starts.tolist(), programs.lengths.tolist())]
