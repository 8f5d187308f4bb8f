"""Numba kernel: exact speculative-decoding objectives for a whole population.

The programs are the engine's linearised trees (``treeio.linearise``) and are
run by the same interpreter as the seed objective (``kernels.run_program``)
over the candidate rows of a v2 split (``spec.SpecArrays.X``: one row per input,
opcode = row index, so programs may read inputs 0..8). Threads go over groups
of programs; a group goes over tiles of whole blocks, each tile scored by every
program of the group while it is in cache. Each program's sums are its own
(exact integers), so results do not depend on the thread count or the grouping.

Per program the kernel returns the sums ``objectives_from_sums`` reads (layout
``SUMS``): tokens, tv, kl, extra acceptance mass and tokens^2 summed over
blocks, then the per-block-position numerators and denominators of acceptance,
the per-block-position reach-weighted slot TV, and last the reach-weighted
tail mass: the reach of the slots whose TV exceeds ``tail_cap`` (so "the
reach-weighted 99th percentile of slot TV is at most C" is "tail mass at C
<= 1% of the total reach", a sum like the others). Each block's terms are
rounded once to 128-bit fixed point (``kernels.fixed``) and added as integers,
so the sums of a split are the same bit for bit in one pass or as the sum of
its shards' sums (``population_sums`` gives the integers,
``population_objectives`` their float64 values).
The per-position formulas are exactly those of ``spec.position_terms`` (the
numpy reference the tests compare against).
"""

from __future__ import annotations

import math

import numpy as np
import numba
from numba import njit, prange

from evolve.objectives import spec
from evolve.kernels import fixed
from evolve.kernels.fixed import add_to
from evolve.kernels.tokens import OP_CONST, run_program

RESIDUAL_EPS = spec.RESIDUAL_EPS
TAIL_OFF = spec.TAIL_OFF
TILE_ROWS = 1024         # candidate rows per tile (rounded down to whole blocks, >= 1 block)
GROUP = 8                # at most this many programs per work item share each tile
SUMS = ("tokens", "tv", "kl", "extra", "tokens_sq")   # then acc_num[g], acc_den[g], tv[g], tail


@njit(cache=True, nogil=True, inline="always")
def _clip(x):
    """x clipped to [0, 1], NaN to 0, -0.0 to 0.0, without branches (fmax/fmin, then
    + 0.0 turns -0.0 into 0.0): thresholds near 0 or 1 at random mispredict branches."""
    return np.fmin(np.fmax(x, 0.0), 1.0) + 0.0


@njit(cache=True, nogil=True, inline="always")
def _kl_term(o, p):
    return o * math.log(o / p) if o > 0.0 else 0.0


@njit(cache=True, nogil=True)
def _blocks(h, b0, nb, g, k, cq, cp, cr, rowc, dcand, std_x, with_kl, cap, a, acc):
    """Add the sums of blocks b0..b0+nb (thresholds h[0:nb*g*k]) to acc, (C, 2)
    fixed point: each block's terms are rounded once and added exactly.

    cr: residual weight of each candidate (max(0, p - q), or p on fallback rows);
    rowc: per-row constants (see ``Prepared``); a: scratch of length k.
    A block's 6 + 3g values are collected first and then added in one loop (one
    copy of the fixed-point rounding in the compiled code, not eight); the last
    is the reach of its slots with TV > cap.
    """
    vals = np.empty(acc.shape[0], dtype=np.float64)
    for bb in range(nb):
        w = 1.0
        tok = 1.0
        tv_b = 0.0
        kl_b = 0.0
        ex_b = 0.0
        tail = 0.0
        for j in range(g):
            i = (b0 + bb) * g + j
            base = i * k
            hb = (bb * g + j) * k
            qa = 0.0
            for c in range(k):
                x = _clip(h[hb + c])
                a[c] = x
                qa += cq[base + c] * x
            sq, sqstd, m_tail, tq, eq, ep, tpm, zr, r_tp, r_tm = (
                rowc[i, 0], rowc[i, 1], rowc[i, 2], rowc[i, 3], rowc[i, 4], rowc[i, 5],
                rowc[i, 6], rowc[i, 7], rowc[i, 8], rowc[i, 9])
            alpha = qa + m_tail
            rho = (sq - qa) + (tq - m_tail)
            s = rho / zr
            tv = 0.0
            kl = 0.0
            for c in range(k):
                p = cp[base + c]
                o = cq[base + c] * a[c] + s * cr[base + c]
                tv += abs(o - p)
                if with_kl:
                    kl += _kl_term(o, p)
            o_tp = eq + s * r_tp
            o_tm = tpm + s * r_tm
            tv += abs(o_tp - ep) + abs(o_tm - tpm)
            tv *= 0.5
            if with_kl:
                kl += _kl_term(o_tp, ep) + _kl_term(o_tm, tpm)
                if kl < 0.0:
                    kl = 0.0
            vals[5 + j] = w * alpha
            vals[5 + g + j] = w
            vals[5 + 2 * g + j] = w * tv
            tok += w * alpha
            tv_b += w * tv
            kl_b += w * kl
            ex_b += w * (qa - sqstd)
            if tv > cap:
                tail += w
            dc = dcand[i]
            w *= a[dc] if dc >= 0 else std_x[i]
        vals[0] = tok
        vals[1] = tv_b
        vals[2] = kl_b
        vals[3] = ex_b
        vals[4] = tok * tok
        vals[5 + 3 * g] = tail
        for c in range(6 + 3 * g):
            add_to(acc, c, vals[c])


@njit(parallel=True, cache=True, nogil=True)
def _population_objectives(ops, consts, starts, lengths, max_stack, X, g, k, tile_blocks,
                           group, cq, cp, cr, rowc, dcand, std_x, with_kl, cap, out):
    n_blocks = dcand.shape[0] // g
    width = tile_blocks * g * k
    P = starts.shape[0]
    for gi in prange((P + group - 1) // group):
        p0 = gi * group
        p1 = min(P, p0 + group)
        stack = np.empty((max_stack, width), dtype=np.float64)
        a = np.empty(k, dtype=np.float64)
        acc = np.zeros((p1 - p0, out.shape[1], 2), dtype=np.int64)
        for b0 in range(0, n_blocks, tile_blocks):
            nb = min(tile_blocks, n_blocks - b0)
            for pi in range(p0, p1):        # the tile stays in cache for the group
                run_program(ops, consts, starts[pi], lengths[pi], X, b0 * g * k, nb * g * k,
                            stack)
                _blocks(stack[0], b0, nb, g, k, cq, cp, cr, rowc, dcand, std_x, with_kl, cap,
                        a, acc[pi - p0])
        for pi in range(p0, p1):
            for c in range(out.shape[1]):
                out[pi, c, 0] = acc[pi - p0, c, 0]
                out[pi, c, 1] = acc[pi - p0, c, 1]


@njit(cache=True, nogil=True)
def _threshold_objectives(h, g, k, cq, cp, cr, rowc, dcand, std_x, with_kl, cap, out):
    n_blocks = dcand.shape[0] // g
    a = np.empty(k, dtype=np.float64)
    _blocks(h, 0, n_blocks, g, k, cq, cp, cr, rowc, dcand, std_x, with_kl, cap, a, out)


class Prepared:
    """Rule-independent per-candidate and per-row constants of a split, made once.

    rowc columns: sum_c q, sum_c q min(1, p/q), m_tail = q(T+) + p(T-), q(T), q(T+),
    p(T+), p(T-), the residual normaliser (Z, or total p on fallback rows) and the
    residual weights of the tail bins T+ and T-.
    """

    def __init__(self, sa: spec.SpecArrays):
        n, k = sa.n, sa.k
        cq = sa.cq.reshape(n, k)
        cp = sa.cp.reshape(n, k)
        rplus = np.maximum(cp - cq, 0.0)
        z = rplus.sum(axis=1) + (sa.ep - sa.eq)
        fb = z < RESIDUAL_EPS
        self.cr = np.ascontiguousarray(np.where(fb[:, None], cp, rplus).reshape(-1))
        tpm = sa.tp - sa.ep
        self.rowc = np.ascontiguousarray(np.stack([
            cq.sum(axis=1), (cq * np.minimum(1.0, cp / cq)).sum(axis=1), sa.eq + tpm, sa.tq,
            sa.eq, sa.ep, tpm, np.where(fb, cp.sum(axis=1) + sa.tp, z),
            np.where(fb, sa.ep, sa.ep - sa.eq), np.where(fb, tpm, 0.0)], axis=1))
        self.sa = sa


def prepared(sa: spec.SpecArrays) -> Prepared:
    """The Prepared constants of ``sa`` (cached on the object)."""
    pr = getattr(sa, "_prepared", None)
    if pr is None:
        pr = Prepared(sa)
        object.__setattr__(sa, "_prepared", pr)
    return pr


def _args(sa: spec.SpecArrays):
    pr = prepared(sa)
    return (sa.cq, sa.cp, pr.cr, pr.rowc, sa.dcand, sa.std_x)


def _check_inputs(programs, sa: spec.SpecArrays) -> None:
    loads = programs.ops[programs.ops < OP_CONST]
    if loads.size and int(loads.max()) >= sa.X.shape[0]:
        raise ValueError(f"a program reads input opcode {int(loads.max())}, but the candidate "
                         f"matrix has {sa.X.shape[0]} inputs ({', '.join(spec.FEATURES)})")


def population_sums(programs, sa: spec.SpecArrays, with_kl: bool = True,
                    tail_cap: float = TAIL_OFF) -> np.ndarray:
    """Exact sums for every program, int64 (P, 6 + 3g, 2): 128-bit fixed point
    (``kernels.fixed``); the sums of shards add up to the sums of their union.

    ``with_kl=False`` skips the logarithms (about half the objective's cost); the
    kl sum is then 0. The last sum is the reach of the slots with TV > tail_cap."""
    _check_inputs(programs, sa)
    P = len(programs)
    out = np.zeros((P, len(SUMS) + 3 * sa.g + 1, 2), dtype=np.int64)
    if P:
        tile_blocks = max(1, TILE_ROWS // (sa.g * sa.k))
        # programs share a tile while it is in cache, but every thread gets work
        group = max(1, min(GROUP, P // (2 * numba.get_num_threads())))
        _population_objectives(programs.ops, programs.consts, programs.starts, programs.lengths,
                               programs.max_stack, sa.X, sa.g, sa.k, tile_blocks, group,
                               *_args(sa), bool(with_kl), float(tail_cap), out)
    return out


def population_objectives(programs, sa: spec.SpecArrays, with_kl: bool = True,
                          tail_cap: float = TAIL_OFF) -> np.ndarray:
    """Sums for every program, float64 (P, 6 + 3g); see ``spec.objectives_from_sums``."""
    return fixed.to_float(population_sums(programs, sa, with_kl, tail_cap))


def threshold_objectives(h, sa: spec.SpecArrays, with_kl: bool = True) -> spec.Objectives:
    """Objectives of a threshold array over the n*k candidate rows (kernel path)."""
    h = np.ascontiguousarray(np.broadcast_to(np.asarray(h, dtype=np.float64), (sa.n * sa.k,)))
    out = np.zeros((len(SUMS) + 3 * sa.g + 1, 2), dtype=np.int64)
    _threshold_objectives(h, sa.g, sa.k, *_args(sa), bool(with_kl), TAIL_OFF, out)
    return spec.objectives_from_sums(fixed.to_float(out), sa.n_blocks, sa.g)


def population_results(programs, sa: spec.SpecArrays, with_kl: bool = True) -> list:
    """``spec.Objectives`` of every program."""
    return [spec.objectives_from_sums(row, sa.n_blocks, sa.g)
            for row in population_objectives(programs, sa, with_kl)]
