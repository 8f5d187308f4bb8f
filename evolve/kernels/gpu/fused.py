"""The fused interpreter in Triton: the token and trace kernels in one launch each,
bit for bit the Numba kernels' counts and 128-bit trace sums.

One launch scores a whole population over a chunk of rows. Each thread interprets
the postfix program (``treeio.linearise``) on its own rows, with the program's
intermediates in registers: the top four stack slots are four registers (a push
shifts them down, a binary operation shifts them up), deeper slots spill to a small
per-block scratch (rare: only programs more than four deep reach it). A thread
block runs one program at a time, so every thread takes the same branch at every
opcode (the opcode is a scalar the whole block reads), and its rows are contiguous
(the loads are coalesced). The grid is persistent (as many thread blocks as the
multiprocessors hold, each taking the next work item from an atomic counter until none
is left): an item is one program over a chunk of rows (tokens) or over a tile of whole
trace blocks (traces); consecutive items are different programs on the same rows, so
the blocks running at once read the same input columns from L2.

Token kernel: each thread tallies its rows' six counts in int64 registers, summed
over the item's tiles; the block reduces them (``tl.sum``) and adds them to the
output with one atomic per count. Integer sums do not depend on their order.

Trace kernel: one thread per trace block. For each drafted position it interprets
the program on the position's k candidates (the clipped thresholds go to the
block's scratch, one row per candidate), then computes the block's terms exactly as
``kernels.speculative._tile_sums`` does for that block, in its order of operations.
Each block value is rounded to the 128-bit fixed point of ``kernels.fixed`` as four
int64 limbs (``evolve.kernels.gpu.traces._limbs``), the block reduces the limbs
and adds them atomically to (4, programs, width) int64 sums, finished on the host
(``traces.finish``). The inputs and constants are read candidate-major (blocks
contiguous), transposed from the device split chunk by chunk.

Bit-identity: every formula is that of ``heuristics/ops.py`` and of the Numba
kernels, one IEEE operation per step: kernels are launched with
``enable_fp_fusion=False`` (no fused multiply-add; ptxas gets ``--fmad=false``);
float64 division and square root are correctly rounded on every GPU; ``exp_poly``
rounds half to even with the 1.5 * 2^52 trick (exact for its reduced argument,
|x / ln 2| < 1100); negation is a multiplication by -1 (exact; some Triton releases
negate by 0 - x, which loses -0.0); python-float constants in arithmetic are typed
float64 against float64 tensors (Triton >= 3.0), but Triton 3.6 rounds one compared
with a float64 tensor to float32 first, so a threshold or a ``where`` value that
float32 cannot hold is a ``tl.full(..., tl.float64)``; registers and accumulators
start as distinct tensors (see ``_run``).
The protected operators keep their NaN meaning (``where`` on ordered comparisons;
``!=`` is unordered). Without a GPU, Triton's interpreter (``TRITON_INTERPRET=1``)
runs the same kernels on numpy, which is how the tests check them
(``tests/test_gpu_fused.py``); ``probe`` checks the compiled kernels on the
device against the Numba interpreter before a process first uses them.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from evolve.kernels import gpu, layout
from evolve.kernels.fixed import HI_SHIFT, LIMIT
from evolve.kernels.tokens import derived_columns, matrix_thresholds
from evolve.kernels.layout import (EXPECTED_SCALE, M_TAIL, P_TMINUS, P_TPLUS, Q_STD, Q_SUM,
                                   Q_TAIL, Q_TPLUS, R_TMINUS, R_TPLUS, TAIL_OFF, Z_RES)
from evolve.lang import primitives as P
from evolve.lang import treeio
from evolve.lang.features import INPUT_NAMES
from heuristics import ops as O

# ------------------------------------------------------------------ constants
# Triton kernels read only constexpr globals.
OP_CONST = tl.constexpr(P.OP_CONST)
ADD = tl.constexpr(P.OP["add"])
SUB = tl.constexpr(P.OP["sub"])
MUL = tl.constexpr(P.OP["mul"])
PDIV = tl.constexpr(P.OP["pdiv"])
PMIN = tl.constexpr(P.OP["pmin"])
PMAX = tl.constexpr(P.OP["pmax"])
NEG = tl.constexpr(P.OP["neg"])
ABS = tl.constexpr(P.OP["absf"])
PLOG = tl.constexpr(P.OP["plog"])
PEXP = tl.constexpr(P.OP["pexp"])
PSQRT = tl.constexpr(P.OP["psqrt"])
SQUARE = tl.constexpr(P.OP["square"])
LT = tl.constexpr(P.OP["lt"])
ITE = tl.constexpr(P.OP["ite"])
AND = tl.constexpr(P.OP["and_"])
OR = tl.constexpr(P.OP["or_"])
NOT = tl.constexpr(P.OP["not_"])
# The interpreter tests opcode ranges: inputs and the constant up to OP_CONST, then the
# binary add..pmax, the unary neg..square, then lt, ite, and, or, not.
if [P.OP[n] for n in ("add", "sub", "mul", "pdiv", "pmin", "pmax", "neg", "absf", "plog", "pexp",
                      "psqrt", "square")] != list(range(P.OP_CONST + 1, P.OP_CONST + 13)) \
        or P.OP["lt"] <= P.OP["square"] or P.OP["ite"] <= P.OP["square"] \
        or P.OP["not_"] <= P.OP["square"]:
    raise ImportError("evolve.kernels.gpu.fused: the opcode ranges of the primitive table changed")

DIV_EPS = tl.constexpr(O.DIV_EPS)
LOG_EPS = tl.constexpr(O.LOG_EPS)
LOG_FLOOR = tl.constexpr(O.LOG_FLOOR)
EXP_MAX = tl.constexpr(O.EXP_MAX)
EXP_CAP = tl.constexpr(O.EXP_CAP)
EXP_LO = tl.constexpr(O.EXP_LO)
EXP_HI = tl.constexpr(O.EXP_HI)
LN2_HI = tl.constexpr(O.LN2_HI)
LN2_LO = tl.constexpr(O.LN2_LO)
INV_LN2 = tl.constexpr(O.INV_LN2)
SQRT2 = tl.constexpr(O.SQRT2)
RINT = tl.constexpr(1.5 * 2.0 ** 52)     # t + RINT - RINT: t rounded half to even
E2, E3, E4, E5, E6, E7 = (tl.constexpr(c) for c in (O.E2, O.E3, O.E4, O.E5, O.E6, O.E7))
E8, E9, E10, E11, E12, E13 = (tl.constexpr(c) for c in (O.E8, O.E9, O.E10, O.E11, O.E12,
                                                        O.E13))
L1, L2, L3, L4, L5 = (tl.constexpr(c) for c in (O.L1, O.L2, O.L3, O.L4, O.L5))
L6, L7, L8, L9, L10 = (tl.constexpr(c) for c in (O.L6, O.L7, O.L8, O.L9, O.L10))
MANTISSA = tl.constexpr(int(O._MANTISSA))
EXPONENT_ONE = tl.constexpr(int(O._EXPONENT_ONE))
INF = tl.constexpr(float("inf"))
EXPECTED = tl.constexpr(EXPECTED_SCALE)
FIX_LIMIT = tl.constexpr(LIMIT)
FIX_HI = tl.constexpr(2.0 ** HI_SHIFT)
TWO32 = tl.constexpr(2.0 ** 32)
TWO64 = tl.constexpr(2.0 ** 64)
TWO23 = tl.constexpr(2.0 ** 23)
INV32 = tl.constexpr(2.0 ** -32)
INV23 = tl.constexpr(2.0 ** -23)
# the sums' scalar positions (the series' and the tail's depend on g: arguments)
S_TOKENS = tl.constexpr(layout.TOKENS)
S_TV = tl.constexpr(layout.TV)
S_KL = tl.constexpr(layout.KL)
S_EXTRA = tl.constexpr(layout.EXTRA)
S_TOKENS_SQ = tl.constexpr(layout.TOKENS_SQ)
R_Q_SUM, R_Q_STD, R_M_TAIL, R_Q_TAIL = (tl.constexpr(c) for c in (Q_SUM, Q_STD, M_TAIL, Q_TAIL))
R_Q_TPLUS, R_P_TPLUS, R_P_TMINUS = (tl.constexpr(c) for c in (Q_TPLUS, P_TPLUS, P_TMINUS))
R_Z_RES, R_R_TPLUS, R_R_TMINUS = (tl.constexpr(c) for c in (Z_RES, R_TPLUS, R_TMINUS))

REGISTERS = 4            # stack slots held in registers; deeper ones spill
TOKEN_BLOCK = 256        # rows per tile of the token kernel (two per thread)
TRACE_BLOCK = 128        # trace blocks per tile of the trace kernel (one per thread)
WARPS = 4
BLOCKS_PER_SM = 16       # thread blocks launched per multiprocessor (at most 16 of 128 threads
                         # fit one; those that do not fit start late and find fewer items)


# ------------------------------------------------------------------ the primitives

@triton.jit
def _exp_poly(x):
    """heuristics.ops.exp_poly (x not NaN)."""
    x = tl.where(x < EXP_LO, EXP_LO, tl.where(x > EXP_HI, EXP_HI, x))
    t = x * INV_LN2
    k = (t + RINT) - RINT            # (a zero's sign, which np.rint keeps, changes no result)
    r = (x - k * LN2_HI) - k * LN2_LO
    q = E12 + r * E13                # Horner's scheme from the innermost term out
    p = r * (E2 + r * (E3 + r * (E4 + r * (E5 + r * (E6 + r * (E7 + r * (E8 + r * (
        E9 + r * (E10 + r * (E11 + r * q))))))))))
    y = 1.0 + (r + r * p)
    ki = k.to(tl.int64)
    k1 = ki >> 1
    f1 = ((k1 + 1023) << 52).to(tl.float64, bitcast=True)
    f2 = (((ki - k1) + 1023) << 52).to(tl.float64, bitcast=True)
    return (y * f1) * f2


@triton.jit
def _log_poly(x):
    """heuristics.ops.log_poly."""
    b = x.to(tl.int64, bitcast=True)
    m = ((b & MANTISSA) | EXPONENT_ONE).to(tl.float64, bitcast=True)
    big = m > tl.full(m.shape, SQRT2, tl.float64)
    m = tl.where(big, m * 0.5, m)
    e = ((b >> 52) - 1023).to(tl.float64) + big.to(tl.float64)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    q = L9 + z * L10                 # Horner's scheme from the innermost term out
    R = z * (L1 + z * (L2 + z * (L3 + z * (L4 + z * (L5 + z * (L6 + z * (L7 + z * (
        L8 + z * q))))))))
    y = e * LN2_HI + (f - (s * (f - R) - e * LN2_LO))
    return tl.where(x == INF, x, y)


@triton.jit
def _plog(a):
    x = tl.abs(a)
    ok = x > tl.full(x.shape, LOG_EPS, tl.float64)
    return tl.where(ok, _log_poly(tl.where(ok, x, 1.0)), tl.full(x.shape, LOG_FLOOR, tl.float64))


@triton.jit
def _pexp(a):
    ok = a < EXP_MAX
    return tl.where(ok, _exp_poly(tl.where(ok, a, 0.0)), tl.full(a.shape, EXP_CAP, tl.float64))


@triton.jit
def _run(ops, consts, start, length, X, sx, U, su, nin, rows, mask, spill, lanes,
         USE_U: tl.constexpr, BLOCK: tl.constexpr):
    """The values of the program ops[start:start + length] on ``rows`` (int64 offsets
    into a column; input j at X + j * sx, plog/pexp/psqrt of it at U + (3 j') * su
    with USE_U), [BLOCK] float64. Stack slots sp-1 .. sp-4 are r0 .. r3; slot i < sp-4
    is spill row i (this block's own scratch, ``spill``)."""
    # Four distinct tensors: Triton's compiler carries through the loop only the names
    # whose value the body changes, judged by identity, so a register that starts as
    # another one's alias (r1 = r0) and is assigned r0 in the body is taken for
    # unchanged and stays 0 (the interpreter, plain Python, does not show it; the
    # tests read the compiled loop's carried values, tests/test_gpu_fused.py).
    r0 = tl.zeros([BLOCK], dtype=tl.float64)
    r1 = tl.zeros([BLOCK], dtype=tl.float64)
    r2 = tl.zeros([BLOCK], dtype=tl.float64)
    r3 = tl.zeros([BLOCK], dtype=tl.float64)
    sp = 0
    k = start
    end = start + length
    while k < end:
        op = tl.load(ops + k)
        if op <= OP_CONST:                           # a leaf: push it
            if op == OP_CONST:
                v = tl.full([BLOCK], tl.load(consts + k), tl.float64)
            else:
                nxt = tl.load(ops + k + 1)           # ops end with a -1: always readable
                fold = False
                if USE_U:
                    fold = (nxt >= PLOG) & (nxt <= PSQRT)
                if fold:                             # plog/pexp/psqrt of an input: from U
                    v = tl.load(U + tl.cast((nxt - PLOG) * nin + op, tl.int64) * su + rows,
                                mask=mask, other=0.0)
                    k += 1
                else:
                    v = tl.load(X + tl.cast(op, tl.int64) * sx + rows, mask=mask, other=0.0)
            if sp >= 4:
                tl.debug_barrier()                   # the slot's last reader may be another thread
                tl.store(spill + (sp - 4) * BLOCK + lanes, r3)
            r3 = r2
            r2 = r1
            r1 = r0
            r0 = v
            sp += 1
        elif op <= PMAX:                             # binary: r0 = op(r0, r1), r0 first
            if op == ADD:
                r0 = r0 + r1
            elif op == SUB:
                r0 = r0 - r1
            elif op == MUL:
                r0 = r0 * r1
            elif op == PDIV:
                r0 = tl.where(tl.abs(r1) > tl.full(r1.shape, DIV_EPS, tl.float64), r0 / r1, 1.0)
            elif op == PMIN:
                r0 = tl.where(r0 < r1, r0, r1)
            else:  # PMAX
                r0 = tl.where(r0 > r1, r0, r1)
            r1 = r2
            r2 = r3
            if sp >= 5:
                tl.debug_barrier()                   # the slot's writer may be another thread
                r3 = tl.load(spill + (sp - 5) * BLOCK + lanes)
            sp -= 1
        elif op <= SQUARE:                           # unary: r0 = op(r0)
            if op == NEG:
                r0 = r0 * -1.0
            elif op == ABS:
                r0 = tl.abs(r0)
            elif op == PLOG:
                r0 = _plog(r0)
            elif op == PEXP:
                r0 = _pexp(r0)
            elif op == PSQRT:
                r0 = tl.sqrt(tl.abs(r0))
            else:  # SQUARE
                r0 = r0 * r0
        elif op == ITE:                              # [..., b, a, c, ite]: c ? a : b
            r0 = tl.where(r0 != 0.0, r1, r2)
            r1 = r3
            if sp >= 5:
                tl.debug_barrier()
                r2 = tl.load(spill + (sp - 5) * BLOCK + lanes)
            if sp >= 6:
                r3 = tl.load(spill + (sp - 6) * BLOCK + lanes)
            sp -= 2
        elif op == NOT:
            r0 = (r0 == 0.0).to(tl.float64)
        else:                                        # the logical binaries LT, AND, OR
            if op == LT:
                r0 = (r0 < r1).to(tl.float64)
            elif op == AND:
                r0 = ((r0 != 0.0) & (r1 != 0.0)).to(tl.float64)
            else:  # OR
                r0 = ((r0 != 0.0) | (r1 != 0.0)).to(tl.float64)
            r1 = r2
            r2 = r3
            if sp >= 5:
                tl.debug_barrier()
                r3 = tl.load(spill + (sp - 5) * BLOCK + lanes)
            sp -= 1
        k += 1
    return r0


# ------------------------------------------------------------------ token kernel

@triton.jit
def _token_kernel(ops, consts, starts, lengths, n_progs, X, sx, U, su, nin, n, rand, base,
                  std_q, out, spill, depth, tiles, per_item, n_items, next_item,
                  TALLY: tl.constexpr, USE_U: tl.constexpr, BLOCK: tl.constexpr):
    """Work items taken in order from the counter ``next_item``: item i is program
    i % n_progs over tiles (i // n_progs) * per_item ... of BLOCK rows. TALLY: add the
    six counts of ``kernels.tokens._tally`` to out (P, 6) int64; else store the values
    in out (P, n)."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    mine = spill + tl.cast(pid, tl.int64) * depth * BLOCK
    item = tl.atomic_add(next_item, 1)
    while item < n_items:
        p = item % n_progs
        t0 = (item // n_progs) * per_item
        t1 = tl.minimum(t0 + per_item, tiles)
        start = tl.load(starts + p)
        length = tl.load(lengths + p)
        a0 = tl.zeros([BLOCK], dtype=tl.int64)     # distinct tensors (see _run)
        a1 = tl.zeros([BLOCK], dtype=tl.int64)
        a2 = tl.zeros([BLOCK], dtype=tl.int64)
        e0 = tl.zeros([BLOCK], dtype=tl.int64)
        e1 = tl.zeros([BLOCK], dtype=tl.int64)
        e2 = tl.zeros([BLOCK], dtype=tl.int64)
        for t in range(t0, t1):
            rows = tl.cast(t, tl.int64) * BLOCK + lanes
            mask = rows < n
            h = _run(ops, consts, start, length, X, sx, U, su, nin, rows, mask, mine, lanes,
                     USE_U, BLOCK)
            if TALLY:
                acc = (tl.load(rand + rows, mask=mask, other=1.0) < h) & mask
                b = tl.load(base + rows, mask=mask, other=0) != 0
                a0 += acc.to(tl.int64)
                a1 += (acc & (~b)).to(tl.int64)
                a2 += (b & (~acc)).to(tl.int64)
                q = tl.where(h > 0.0, tl.where(h > 1.0, 1.0, h), 0.0)
                qi = tl.where(mask, (q * EXPECTED).to(tl.int64), 0)
                d = qi - tl.load(std_q + rows, mask=mask, other=0)
                e0 += qi
                e1 += tl.where(d > 0, d, 0)
                e2 += tl.where(d < 0, -d, 0)
            else:
                tl.store(out + tl.cast(p, tl.int64) * n + rows, h, mask=mask)
        if TALLY:
            o = out + tl.cast(p, tl.int64) * 6
            tl.atomic_add(o, tl.sum(a0, axis=0))
            tl.atomic_add(o + 1, tl.sum(a1, axis=0))
            tl.atomic_add(o + 2, tl.sum(a2, axis=0))
            tl.atomic_add(o + 3, tl.sum(e0, axis=0))
            tl.atomic_add(o + 4, tl.sum(e1, axis=0))
            tl.atomic_add(o + 5, tl.sum(e2, axis=0))
        item = tl.atomic_add(next_item, 1)


# ------------------------------------------------------------------ trace kernel

@triton.jit
def _kl_term(o, p):
    """speculative._kl_term: o log(o / p) with log_poly, 0 where o <= 0."""
    pos = o > 0.0
    return tl.where(pos, o * _log_poly(tl.where(pos, o / p, 1.0)), 0.0)


@triton.jit
def _emit(acc, col, plane, v, mask):
    """Add the tile's values v (masked lanes: nothing) to the fixed-point sums at
    acc + col: ``traces._limbs`` (``fixed.add_to``'s rounding: NaN is 0, saturating at
    +-LIMIT) in four int64 limbs, summed over the tile, one atomic per limb
    (limb l at acc + l * plane + col)."""
    v = tl.where(mask & (v == v), v, 0.0)
    v = tl.where(v > FIX_LIMIT, FIX_LIMIT, tl.where(v < -FIX_LIMIT, -FIX_LIMIT, v))
    neg = v < 0.0
    t = tl.where(neg, v * -1.0, v) * FIX_HI
    hf = tl.floor(t)
    lf = tl.floor((t - hf) * TWO64 + 0.5)
    a = tl.floor(lf * INV32)
    b = lf - a * TWO32
    hh = tl.floor(hf * INV23)
    hl = hf - hh * TWO23
    sign = (1 - 2 * neg.to(tl.int64))[None, :]
    limb = tl.arange(0, 4)[:, None]                    # one reduction for the four limbs
    parts = tl.where(limb == 0, hh[None, :], tl.where(limb == 1, hl[None, :], tl.where(
        limb == 2, a[None, :], b[None, :]))).to(tl.int64) * sign
    tl.atomic_add(acc + col + tl.arange(0, 4) * plane, tl.sum(parts, axis=1))


@triton.jit
def _trace_kernel(ops, consts, starts, lengths, n_progs, X, nin, nb, g, k, lq, lp, lr, lrow,
                  ldc, lsx, acc, plane, width, num0, reach0, tvp0, tail_col, cap_at, spill,
                  depth,
                  hbuf, n_items, next_item, WITH_KL: tl.constexpr, BLOCK: tl.constexpr):
    """Work items taken in order from the counter ``next_item``: item i is program
    i % n_progs over trace blocks (i // n_progs) * BLOCK ..., one thread per block. Columns are candidate-major over
    the chunk's nb blocks: X (nin, g k, nb); lq, lp, lr (g k, nb); lrow (constants, g,
    nb); ldc, lsx (g, nb). acc: the batch's int64 limb sums, program p's sum j of limb l
    at acc + l * plane + p * width + j. cap_at: the tail cap (one float64)."""
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    mine = spill + tl.cast(pid, tl.int64) * depth * BLOCK
    hs = hbuf + tl.cast(pid, tl.int64) * k * BLOCK          # this block's thresholds, row c
    gk = g * k
    sx = tl.cast(gk, tl.int64) * nb
    gnb = tl.cast(g, tl.int64) * nb
    cap = tl.load(cap_at)
    item = tl.atomic_add(next_item, 1)
    while item < n_items:
        p = item % n_progs
        blk = tl.cast(item // n_progs, tl.int64) * BLOCK + lanes
        mask = blk < nb
        start = tl.load(starts + p)
        length = tl.load(lengths + p)
        pc = tl.cast(p, tl.int64) * width
        w = tl.full([BLOCK], 1.0, tl.float64)      # distinct tensors (see _run)
        tok = tl.full([BLOCK], 1.0, tl.float64)
        tvb = tl.zeros([BLOCK], dtype=tl.float64)
        klb = tl.zeros([BLOCK], dtype=tl.float64)
        exb = tl.zeros([BLOCK], dtype=tl.float64)
        tail = tl.zeros([BLOCK], dtype=tl.float64)
        for s in range(g):
            qa = tl.zeros([BLOCK], dtype=tl.float64)
            tl.debug_barrier()                       # the scratch rows' last readers are done
            for c in range(k):
                rows = tl.cast(s * k + c, tl.int64) * nb + blk
                h = _run(ops, consts, start, length, X, sx, X, sx, nin, rows, mask, mine,
                         lanes, False, BLOCK)
                h = tl.where(h > 0.0, h, 0.0)        # clipped: NaN to 0, -0.0 to 0.0
                h = tl.where(h > 1.0, 1.0, h)
                tl.store(hs + c * BLOCK + lanes, h)
                qa = qa + tl.load(lq + rows, mask=mask, other=0.0) * h
            tl.debug_barrier()                       # the scratch rows are written
            rb = s * nb + blk
            row = lrow + rb
            m_tail = tl.load(row + R_M_TAIL * gnb, mask=mask, other=0.0)
            scale = ((tl.load(row + R_Q_SUM * gnb, mask=mask, other=0.0) - qa)
                     + (tl.load(row + R_Q_TAIL * gnb, mask=mask, other=0.0) - m_tail)) \
                / tl.load(row + R_Z_RES * gnb, mask=mask, other=1.0)
            tv = tl.zeros([BLOCK], dtype=tl.float64)
            kl = tl.zeros([BLOCK], dtype=tl.float64)
            for c in range(k):
                rows = tl.cast(s * k + c, tl.int64) * nb + blk
                h = tl.load(hs + c * BLOCK + lanes)
                o = tl.load(lq + rows, mask=mask, other=0.0) * h \
                    + scale * tl.load(lr + rows, mask=mask, other=0.0)
                pcand = tl.load(lp + rows, mask=mask, other=0.0)
                tv = tv + tl.abs(o - pcand)
                if WITH_KL:
                    kl = kl + _kl_term(o, pcand)
            alpha = qa + m_tail
            p_tplus = tl.load(row + R_P_TPLUS * gnb, mask=mask, other=0.0)
            p_tminus = tl.load(row + R_P_TMINUS * gnb, mask=mask, other=0.0)
            o_tp = tl.load(row + R_Q_TPLUS * gnb, mask=mask, other=0.0) \
                + scale * tl.load(row + R_R_TPLUS * gnb, mask=mask, other=0.0)
            o_tm = p_tminus + scale * tl.load(row + R_R_TMINUS * gnb, mask=mask, other=0.0)
            tv = (tv + (tl.abs(o_tp - p_tplus) + tl.abs(o_tm - p_tminus))) * 0.5
            if WITH_KL:
                kl = kl + (_kl_term(o_tp, p_tplus) + _kl_term(o_tm, p_tminus))
                klb = klb + w * tl.where(kl > 0.0, kl, 0.0)
            _emit(acc, pc + num0 + s, plane, w * alpha, mask)
            _emit(acc, pc + reach0 + s, plane, w, mask)
            _emit(acc, pc + tvp0 + s, plane, w * tv, mask)
            tok = tok + w * alpha
            tvb = tvb + w * tv
            exb = exb + w * (qa - tl.load(row + R_Q_STD * gnb, mask=mask, other=0.0))
            tail = tail + tl.where(tv > cap, w, 0.0)
            dc = tl.load(ldc + rb, mask=mask, other=-1)
            drafted = tl.load(hs + tl.where(dc >= 0, dc, 0) * BLOCK + lanes)
            w = w * tl.where(dc >= 0, drafted, tl.load(lsx + rb, mask=mask, other=0.0))
        _emit(acc, pc + S_TOKENS, plane, tok, mask)
        _emit(acc, pc + S_TV, plane, tvb, mask)
        _emit(acc, pc + S_KL, plane, klb, mask)
        _emit(acc, pc + S_EXTRA, plane, exb, mask)
        _emit(acc, pc + S_TOKENS_SQ, plane, tok * tok, mask)
        _emit(acc, pc + tail_col, plane, tail, mask)
        item = tl.atomic_add(next_item, 1)


# ------------------------------------------------------------------ launching

TILES_PER_ITEM = 16      # token kernel: tiles per work item (the rows programs share in L2)
_ERRORS = (triton.CompilationError, triton.OutOfResources, RuntimeError, ValueError,
           TypeError, AttributeError, ImportError)   # what a Triton release that cannot
                                                      # compile or launch these kernels raises


def interpreted() -> bool:
    """Whether this process runs the kernels in Triton's interpreter (TRITON_INTERPRET=1
    when Triton and this module were imported): numpy on the CPU, for tests without a
    GPU."""
    return not isinstance(_token_kernel, triton.JITFunction) \
        and not isinstance(tl.zeros, triton.JITFunction)


class Programs:
    """A population's linearised programs on a device, as the kernels read them: the
    opcodes with one -1 after the last (a leaf may look at the next opcode), the
    constants, starts and lengths, and the spill rows a thread block needs."""

    def __init__(self, programs, dev):
        self.n = len(programs)
        self.ops = torch.as_tensor(np.append(np.asarray(programs.ops, dtype=np.int32),
                                             np.int32(-1)), device=dev)
        self.consts = torch.as_tensor(np.asarray(programs.consts, dtype=np.float64),
                                      device=dev)
        self.starts = torch.as_tensor(np.asarray(programs.starts, dtype=np.int64), device=dev)
        self.lengths = torch.as_tensor(np.asarray(programs.lengths, dtype=np.int64), device=dev)
        self.depth = max(1, int(programs.max_stack) - REGISTERS)
        self.device = dev


def _grid(dev, items: int) -> int:
    """Thread blocks to launch: as many as the multiprocessors can hold (BLOCKS_PER_SM
    each; one multiprocessor's worth on the interpreter), at most one per item. Blocks take items from a counter, so a block
    that starts late takes fewer, and the items running at once are consecutive: the
    same rows for different programs."""
    sms = torch.cuda.get_device_properties(dev).multi_processor_count \
        if dev.type == "cuda" else 1
    return max(1, min(int(items), sms * BLOCKS_PER_SM))


def _counter(dev):
    """The work-item counter of one launch (int32, 0)."""
    return torch.zeros(1, dtype=torch.int32, device=dev)


def _check_device(dev) -> None:
    if dev.type != "cuda" and not interpreted():
        raise gpu.DeviceError.of("device", f"the fused kernels run on torch device "
                                 f"{dev.type!r} only in Triton's interpreter: set "
                                 "TRITON_INTERPRET=1 before Triton is imported")


class Call:
    """One launch: ``kernel[(grid,)](*args, **meta)``, with no fused multiply-add (the
    Numba kernels round every product). Every argument is a tensor or an int: Triton
    passes a Python float as float32, so a float64 scalar (the tail cap) goes by memory."""

    def __init__(self, kernel, grid: int, args: tuple, meta: dict):
        self.kernel, self.grid, self.args, self.meta = kernel, grid, args, meta

    def launch(self) -> None:
        _check_device(self.args[0].device)
        with np.errstate(all="ignore"):   # the interpreter computes both sides of a where
            self.kernel[(self.grid,)](*self.args, num_warps=WARPS, enable_fp_fusion=False,
                                      **self.meta)


def token_call(progs: Programs, X, U, out, rand=None, base=None, std_q=None,
               block: int | None = None) -> Call | None:
    """The launch of ``token_counts`` (with rand, base, std_q) or ``token_values``
    (without), None when there is nothing to score. The launch constants (``block``:
    TOKEN_BLOCK, TILES_PER_ITEM, WARPS, BLOCKS_PER_SM) are read at each call, so
    ``benchmarks/speed/gpu_tune.py`` can time others."""
    block = block or TOKEN_BLOCK
    m = int(X.shape[1])
    if not progs.n or not m:
        return None
    tiles = -(-m // block)
    per_item = min(TILES_PER_ITEM, tiles)
    items = progs.n * -(-tiles // per_item)
    grid = _grid(progs.device, items)
    spill = torch.empty(grid * progs.depth * block, dtype=torch.float64, device=progs.device)
    tally = rand is not None
    if not tally:
        rand = base = std_q = out      # not read
    return Call(_token_kernel, grid, (
        progs.ops, progs.consts, progs.starts, progs.lengths, progs.n, X, X.stride(0), U,
        U.stride(0), X.shape[0], m, rand, base, std_q, out, spill, progs.depth, tiles,
        per_item, items, _counter(progs.device)),
        dict(TALLY=tally, USE_U=True, BLOCK=block))


def token_counts(progs: Programs, X, U, rand, base, std_q, out, block: int | None = None) -> None:
    """Add the six counts of every program over the rows of X (inputs x rows on the
    device; U = ``interp.derived(X)``, rand, base, std_q: those rows' columns) to out,
    int64 (P, 6) on the device (``kernels.tokens.population_counts``'s integers)."""
    call = token_call(progs, X, U, out, rand, base, std_q, block)
    if call is not None:
        call.launch()


def token_values(progs: Programs, X, U, out, block: int | None = None) -> None:
    """Every program's values over the rows of X into out, float64 (P, rows) on the
    device (``kernels.tokens.matrix_thresholds``'s bits)."""
    call = token_call(progs, X, U, out, block=block)
    if call is not None:
        call.launch()


def candidate_major(part) -> tuple:
    """A device trace chunk's columns (``traces.DeviceTrace``, blocks first) as the trace
    kernel reads them, blocks last: X (inputs, g k, nb); lq, lp, lr (g k, nb); lrow
    (constants, g, nb); ldc, lsx (g, nb)."""
    nb = part.shape.n_blocks
    X = part.X.reshape(part.X.shape[0], nb, -1).permute(0, 2, 1).contiguous()
    lq, lp, lr = (t.reshape(nb, -1).t().contiguous() for t in (part.lq, part.lp, part.lr))
    lrow = part.lrow.permute(0, 2, 1).contiguous()
    ldc, lsx = (t.t().contiguous() for t in (part.ldc, part.lsx))
    return X, lq, lp, lr, lrow, ldc, lsx


def trace_call(progs: Programs, cols: tuple, g: int, k: int, acc, p0: int, p1: int,
               cap: float = TAIL_OFF, with_kl: bool = False,
               block: int | None = None) -> Call | None:
    """The launch of ``trace_sums``, None when there is nothing to score (``block``:
    TRACE_BLOCK, read at each call as the other launch constants are)."""
    block = block or TRACE_BLOCK
    X, lq, lp, lr, lrow, ldc, lsx = cols
    nb = int(ldc.shape[1])
    n = p1 - p0
    if n <= 0 or not nb:
        return None
    L = layout.sums_layout(g)
    items = n * -(-nb // block)
    per_block = 8 * (progs.depth + k) * block        # a thread block's scratch, bytes
    grid = max(1, min(_grid(progs.device, items),
                      gpu.memory_budget(progs.device) // (4 * per_block)))
    dev = progs.device
    spill = torch.empty(grid * progs.depth * block, dtype=torch.float64, device=dev)
    hbuf = torch.empty(grid * k * block, dtype=torch.float64, device=dev)
    return Call(_trace_kernel, grid, (
        progs.ops, progs.consts, progs.starts[p0:p1], progs.lengths[p0:p1], n, X, X.shape[0],
        nb, g, k, lq, lp, lr, lrow, ldc, lsx, acc[:, p0:p1], acc.stride(0), L.width,
        L.acc_num.start, L.reach.start, L.tv_pos.start, L.tail,
        torch.full((1,), float(cap), dtype=torch.float64, device=dev), spill, progs.depth,
        hbuf, items, _counter(dev)), dict(WITH_KL=bool(with_kl), BLOCK=block))


def trace_sums(progs: Programs, cols: tuple, g: int, k: int, acc, p0: int, p1: int,
               cap: float = TAIL_OFF, with_kl: bool = False, block: int | None = None) -> None:
    """Add the limb sums of programs p0..p1 over a chunk's blocks (``candidate_major``
    columns) to acc, int64 (4, P, layout.width(g)) on the device, as
    ``traces._limbs(block_values(...)).sum(-1)`` adds them (the Numba kernel's
    integers once ``traces.finish``-ed)."""
    call = trace_call(progs, cols, g, k, acc, p0, p1, cap, with_kl, block)
    if call is not None:
        call.launch()


# ------------------------------------------------------------------ the probe

def _node(name, *args) -> list:
    """A tree in prefix order: primitive ``name`` over the trees ``args``, an input
    named ``name``, or a constant (a float)."""
    if isinstance(name, float):
        return [treeio.Node("const", "const", name)]
    if name in P.OP:
        return [treeio.Node("prim", name)] + [n for a in args for n in a]
    return [treeio.Node("input", name)]


def _probe_programs():
    """Every primitive on inputs, on 1e-300 and on -0.0, exp and log at their edges, and
    stacks deep enough to spill (left spines push one more slot per level). The kernels
    are untyped: a comparison's 0/1 is a value like any other here."""
    a, b, c = (_node(n) for n in INPUT_NAMES[:3])
    trees = [_node(p.name, *(a, b, c)[:p.arity]) for p in P.PRIMITIVES]
    for const in (1e-300, -0.0):
        trees += [_node(p.name, b, *[_node(const)] * (p.arity - 1)) for p in P.PRIMITIVES]
    trees += [_node("pexp", _node("mul", a, _node(700.0))),
              _node("pexp", _node("mul", a, _node(-800.0))),
              _node("pexp", _node("add", a, _node(-709.5))),
              _node("plog", _node("mul", a, _node(5e-324))),
              _node("psqrt", _node("pexp", _node("plog", b))),
              _node("pdiv", b, _node(1e-10)), _node("neg", _node("sub", _node(0.5), _node(0.5)))]
    deep = a
    for j in range(9):
        deep = _node(("add", "mul", "sub", "pdiv", "pmin", "pmax")[j % 6], deep, (b, c)[j % 2])
    trees += [deep, _node("ite", deep, a, b), _node("ite", _node("lt", a, b), deep,
                                                    _node("neg", deep))]
    return trees


def _probe_inputs(n: int = 512) -> np.ndarray:
    """Input rows mixing the edge values (NaN, inf, 0, -0.0, subnormals, huge, the
    protected operators' thresholds) with random ones, shuffled per input."""
    rng = np.random.default_rng(0)
    edge = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-300, -1e-300, 1e300, -1e300,
                     5e-324, 2.2250738585072014e-308, 1e-9, 1e-12, 1.0, -1.0, 0.5, 2.0,
                     49.999999, 50.0, 700.0, -745.13, -800.0, 1.0000000000000002])
    cols = [np.concatenate([edge, rng.normal(0, 3, n // 2 - edge.size),
                            np.exp(rng.uniform(-700, 700, n - n // 2))]) for _ in INPUT_NAMES]
    return np.stack([rng.permutation(col) for col in cols])


def _differ(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Where got and want have other bits (any NaN equals any NaN)."""
    nan = np.isnan(want)
    return np.where(nan, ~np.isnan(got), got.view(np.int64) != want.view(np.int64))


def probe(dev) -> str:
    """'' when the kernels run on ``dev`` and give the Numba interpreter's values bit
    for bit (``_probe_programs`` over ``_probe_inputs``: every primitive at the edges,
    spilled stacks) and the trace kernel compiles and runs; else one line on what failed
    (a Triton release that compiles them differently, or cannot compile them)."""
    trees = _probe_programs()
    programs = treeio.linearise(trees)
    X = _probe_inputs()
    want = matrix_thresholds(programs, X)
    try:
        progs = Programs(programs, dev)
        Xd = torch.as_tensor(X, device=dev)
        out = torch.empty(want.shape, dtype=torch.float64, device=dev)
        token_values(progs, Xd, torch.as_tensor(derived_columns(X), device=dev), out)
        g, k, nb = 2, 3, 5
        gen = torch.Generator().manual_seed(0)
        cols = (Xd[:, :g * k * nb].reshape(-1, g * k, nb).contiguous(),
                *(torch.rand((g * k, nb), generator=gen, dtype=torch.float64).to(dev)
                  for _ in range(3)),
                torch.rand((layout.N_ROW_CONSTANTS, g, nb), generator=gen,
                           dtype=torch.float64).to(dev) + 0.5,
                torch.randint(-1, k, (g, nb), generator=gen).to(dev),
                torch.rand((g, nb), generator=gen, dtype=torch.float64).to(dev))
        few = Programs(treeio.linearise(trees[-3:]), dev)     # the deep ones: spills
        acc = torch.zeros((4, few.n, layout.width(g)), dtype=torch.int64, device=dev)
        trace_sums(few, cols, g, k, acc, 0, few.n, 0.1, True)
        got = out.cpu().numpy()
    except _ERRORS as e:
        line = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return f"the fused kernels do not run here (Triton {triton.__version__}: {line})"
    differ = _differ(got, want)
    if differ.any():
        i, j = np.argwhere(differ)[0]                 # the first program that differs
        return (f"the fused kernels give other bits than the Numba interpreter on "
                f"{int(differ.sum())} of {want.size} probe values (Triton "
                f"{triton.__version__}), first {float(got[i, j])!r} for {float(want[i, j])!r} in "
                f"{treeio.to_string(trees[i])}")
    return ""
