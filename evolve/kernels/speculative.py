"""Numba kernel: exact speculative-decoding objectives for a whole population.

The programs are the engine's linearised trees (``treeio.linearise``) and are
run by the same interpreter as the seed objective (``interpreter.run_program``)
over the candidate rows of a v2 split (``spec.TraceArrays.X``: one row per input,
opcode = row index, so programs may read inputs 0..8). Threads go over groups
of programs; a group goes over tiles of ``TILE_BLOCKS`` whole blocks, each tile
scored by every program of the group while it is in cache. A program's
thresholds on a tile are put in lane-major order (position, candidate, block),
as are the split's per-candidate constants (``Prepared``), so the per-candidate
sums run with the tile's blocks as vector lanes while each block's terms keep
the order of additions of a block scored alone. Each program's sums are its own
(exact integers), so results do not depend on the thread count, the grouping or
the tiling.

Per program the kernel returns the sums ``objectives_from_sums`` reads, laid
out as ``evolve.kernels.layout`` defines (the one definition every writer and
reader goes through): tokens, tv, kl, extra acceptance mass and tokens^2 summed
over blocks, then the per-block-position numerators and denominators of
acceptance, the per-block-position reach-weighted slot TV, and last the
reach-weighted tail mass: the reach of the slots whose TV exceeds ``tail_cap``
(so "the reach-weighted 99th percentile of slot TV is at most C" is "tail mass at C
<= 1% of the total reach", a sum like the others). Each block's terms are
rounded once to 128-bit fixed point (``kernels.fixed``) and added as integers,
so the sums of a split are the same bit for bit in one pass or as the sum of
its shards' sums (``population_sums`` gives the integers,
``population_objectives`` their float64 values).
The per-position formulas are exactly those of ``spec.position_terms`` (the
numpy reference the tests compare against); the KL terms' log is
``heuristics.ops.log_poly`` (within 1 ulp of the C library's log, which the
reference uses), so the torch kernel (``evolve.kernels.gpu.traces``) gives the
same sums, KL included, bit for bit.
"""

from __future__ import annotations

import numpy as np
import numba
from numba import njit

from evolve.data.decode import RESIDUAL_EPS
from evolve.kernels import fixed, layout, threads
from evolve.kernels.fixed import add_to
from evolve.kernels.interpreter import KERNEL, OP_CONST, new_stack, run_program, u
from evolve.kernels.layout import (M_TAIL, P_TMINUS, P_TPLUS, Q_STD, Q_SUM, Q_TAIL, Q_TPLUS,
                                   R_TMINUS, R_TPLUS, TAIL_OFF, Z_RES)
from evolve.lang.features import ALL_INPUT_NAMES
from heuristics.ops import log_poly

TILE_BLOCKS = 32         # blocks per tile: the vector lanes of the per-candidate sums
GROUP = 8                # at most this many programs per work item share each tile

# The layout's offsets, compiled and inlined into the kernel (integer arithmetic on
# the layout's module-level constants).
_series_start = njit(cache=True, nogil=True, inline="always")(layout.series_start)
_trailing_index = njit(cache=True, nogil=True, inline="always")(layout.trailing_index)


@njit(cache=True, nogil=True, inline="always")
def _clip(x):
    """x clipped to [0, 1], NaN to 0, -0.0 to 0.0, without branches (fmax/fmin, then
    + 0.0 turns -0.0 into 0.0): thresholds near 0 or 1 at random mispredict branches."""
    return np.fmin(np.fmax(x, 0.0), 1.0) + 0.0


@njit(inline="always", **KERNEL)
def _kl_term(o, p):
    """o log(o / p), 0 where o <= 0, with the project's own log (``heuristics.ops.log_poly``):
    computed for every o and then selected, without a branch, so the blocks' terms run
    as vector lanes; the torch kernel computes the same bits."""
    t = o * log_poly(o / p)
    return t if o > 0.0 else 0.0


# Rows of the scratch of ``_tile_sums`` (one column per block of the tile): the
# block's running reach, tokens, TV, KL, extra mass and tail reach, the slot's
# accepted mass, residual scale, TV and KL, then the block's values (VALS + c).
W, TOK, TVB, KLB, EXB, TAIL, QA, SCALE, TV, KL, VALS = range(11)


@njit(**KERNEL)      # numpy's error model: a division by 0 is inf or NaN, as in torch
def _tile_sums(H, nb, g, k, lq, lp, lr, lrow, ldc, lsx, off, poff, with_kl, cap, sc, acc, a0):
    """Add the sums of the nb blocks of one tile to acc[a0:a0 + C] ((C, 2) fixed point):
    each block's terms are rounded once and added exactly.

    The tile is lane-major (``Prepared``): H[(s * k + c) * nb + b] is the clipped
    threshold of candidate c of block position s of the tile's block b, and lq, lp,
    lr (per candidate, from ``off``), lrow, ldc, lsx (per drafted position, from
    ``poff``) are in the same order. Every loop over b is innermost, so the blocks
    are vector lanes, while each block's terms are the same operations in the same
    order as for a block alone (the same bits whatever the tile). sc: scratch
    (VALS + C, nb). A block's C = layout.width(g) values (VALS + the layout's
    index) are added in one loop (one copy of the fixed-point rounding in the
    compiled code); the tail sum is the reach of its slots with TV > cap.
    """
    C = sc.shape[0] - VALS
    v_num = VALS + _series_start(layout.ACC_NUM, g)
    v_reach = VALS + _series_start(layout.REACH, g)
    v_tvp = VALS + _series_start(layout.TV_POS, g)
    for b in range(nb):
        sc[W, b] = 1.0
        sc[TOK, b] = 1.0
        sc[TVB, b] = 0.0
        sc[KLB, b] = 0.0
        sc[EXB, b] = 0.0
        sc[TAIL, b] = 0.0
    for s in range(g):
        hs = s * k * nb
        for b in range(nb):
            sc[QA, b] = 0.0
        for c in range(k):
            o = hs + c * nb
            for b in range(nb):
                sc[QA, b] += lq[u(off + o + b)] * H[u(o + b)]
        ps = poff + s * nb
        for b in range(nb):
            r = ps + b
            sc[SCALE, b] = (((lrow[Q_SUM, u(r)] - sc[QA, b])
                             + (lrow[Q_TAIL, u(r)] - lrow[M_TAIL, u(r)])) / lrow[Z_RES, u(r)])
            sc[TV, b] = 0.0
            sc[KL, b] = 0.0
        for c in range(k):
            o = hs + c * nb
            for b in range(nb):
                sc[TV, b] += abs((lq[u(off + o + b)] * H[u(o + b)] + sc[SCALE, b] * lr[u(off + o + b)])
                                 - lp[u(off + o + b)])
        if with_kl:
            for c in range(k):
                o = hs + c * nb
                for b in range(nb):
                    sc[KL, b] += _kl_term(lq[u(off + o + b)] * H[u(o + b)]
                                          + sc[SCALE, b] * lr[u(off + o + b)], lp[u(off + o + b)])
        for b in range(nb):
            r = ps + b
            w = sc[W, b]
            alpha = sc[QA, b] + lrow[M_TAIL, u(r)]
            o_tp = lrow[Q_TPLUS, u(r)] + sc[SCALE, b] * lrow[R_TPLUS, u(r)]
            o_tm = lrow[P_TMINUS, u(r)] + sc[SCALE, b] * lrow[R_TMINUS, u(r)]
            tv = (sc[TV, b] + (abs(o_tp - lrow[P_TPLUS, u(r)])
                               + abs(o_tm - lrow[P_TMINUS, u(r)]))) * 0.5
            if with_kl:
                kl = sc[KL, b] + (_kl_term(o_tp, lrow[P_TPLUS, u(r)])
                                  + _kl_term(o_tm, lrow[P_TMINUS, u(r)]))
                sc[KLB, b] += w * (kl if kl > 0.0 else 0.0)
            sc[v_num + s, b] = w * alpha
            sc[v_reach + s, b] = w
            sc[v_tvp + s, b] = w * tv
            sc[TOK, b] += w * alpha
            sc[TVB, b] += w * tv
            sc[EXB, b] += w * (sc[QA, b] - lrow[Q_STD, u(r)])
            sc[TAIL, b] += w if tv > cap else 0.0
            dc = ldc[u(r)]
            sc[W, b] = w * (H[u(hs + dc * nb + b)] if dc >= 0 else lsx[u(r)])
    for b in range(nb):
        tok = sc[TOK, b]
        sc[VALS + layout.TOKENS, b] = tok
        sc[VALS + layout.TV, b] = sc[TVB, b]
        sc[VALS + layout.KL, b] = sc[KLB, b]
        sc[VALS + layout.EXTRA, b] = sc[EXB, b]
        sc[VALS + layout.TOKENS_SQ, b] = tok * tok
        sc[VALS + _trailing_index(layout.TAIL, g), b] = sc[TAIL, b]
    for c in range(C):
        for b in range(nb):
            add_to(acc, a0 + c, sc[VALS + c, b])


@njit(cache=True, nogil=True)
def _lanes(S, row, off, nb, g, k, H):
    """H = the clipped thresholds S[row, off:] (row order: block, position, candidate)
    of a tile of nb blocks, in lane-major order (position, candidate, block)."""
    for b in range(nb):
        for s in range(g):
            for c in range(k):
                H[u((s * k + c) * nb + b)] = _clip(S[row, u(off + (b * g + s) * k + c)])


@njit(cache=True, nogil=True)
def _population_objectives(i0, i1, group, ops, consts, starts, lengths, max_stack, X, g, k,
                           tile_blocks, lq, lp, lr, lrow, ldc, lsx, with_kl, cap, out):
    """The sums of the programs of work items i0..i1 (``group`` programs an item)."""
    for gi in range(i0, i1):
        _score_group(gi * group, min(starts.shape[0], gi * group + group), ops, consts, starts,
                     lengths, max_stack, X, g, k, tile_blocks, lq, lp, lr, lrow, ldc, lsx,
                     with_kl, cap, out)


@njit(cache=True, nogil=True)
def _score_group(p0, p1, ops, consts, starts, lengths, max_stack, X, g, k, tile_blocks, lq, lp,
                 lr, lrow, ldc, lsx, with_kl, cap, out):
    """The sums of programs p0..p1, which share each tile while it is in cache."""
    n_blocks = ldc.shape[0] // g
    width = tile_blocks * g * k
    C = out.shape[1]
    stack, slot = new_stack(max_stack, width)
    H = np.empty(width, dtype=np.float64)
    sc = np.empty((VALS + C, tile_blocks), dtype=np.float64)
    acc = np.zeros(((p1 - p0) * C, 2), dtype=np.int64)
    for b0 in range(0, n_blocks, tile_blocks):
        nb = min(tile_blocks, n_blocks - b0)
        for pi in range(p0, p1):        # the tile stays in cache for the group
            row = run_program(ops, consts, starts[pi], lengths[pi], X, b0 * g * k, nb * g * k,
                              stack, slot)
            _lanes(stack, row, 0, nb, g, k, H)
            _tile_sums(H, nb, g, k, lq, lp, lr, lrow, ldc, lsx, b0 * g * k, b0 * g, with_kl,
                       cap, sc, acc, (pi - p0) * C)
    for pi in range(p0, p1):
        for c in range(C):
            out[pi, c, 0] = acc[(pi - p0) * C + c, 0]
            out[pi, c, 1] = acc[(pi - p0) * C + c, 1]


@njit(cache=True, nogil=True)
def _threshold_objectives(h, g, k, tile_blocks, lq, lp, lr, lrow, ldc, lsx, with_kl, cap,
                          out):
    n_blocks = ldc.shape[0] // g
    H = np.empty(tile_blocks * g * k, dtype=np.float64)
    sc = np.empty((VALS + out.shape[0], tile_blocks), dtype=np.float64)
    for b0 in range(0, n_blocks, tile_blocks):
        nb = min(tile_blocks, n_blocks - b0)
        _lanes(h.reshape(1, h.shape[0]), 0, b0 * g * k, nb, g, k, H)
        _tile_sums(H, nb, g, k, lq, lp, lr, lrow, ldc, lsx, b0 * g * k, b0 * g, with_kl, cap,
                   sc, out, 0)


def lane_major(a: np.ndarray, g: int, tile_blocks: int) -> np.ndarray:
    """Per-block-major values (n_blocks * g * per values: block, position, then ``per``
    values) in the kernel's lane-major order: tile by tile, (position, value, block)."""
    a = np.asarray(a)
    a = a.reshape(-1, g, a.shape[1] if a.ndim == 2 else 1)
    n_blocks = a.shape[0]
    parts = [a[b0:b0 + tile_blocks].transpose(1, 2, 0).reshape(-1)
             for b0 in range(0, n_blocks, tile_blocks)]
    return np.ascontiguousarray(np.concatenate(parts) if parts else a.reshape(-1))


class Prepared:
    """Rule-independent per-candidate and per-row constants of a split, made once,
    in the kernel's lane-major order (``lane_major``, tiles of TILE_BLOCKS blocks).

    Row constants (``lrow``, one row per constant, in the order and with the indices
    of ``layout.ROW_CONSTANTS``): sum_c q, sum_c q min(1, p/q), m_tail = q(T+) + p(T-),
    q(T), q(T+), p(T+), p(T-), the residual normaliser (Z, or total p on fallback
    rows) and the residual weights of the tail bins T+ and T-; cr is the residual
    weight of each candidate (max(0, p - q), or p on fallback rows).
    """

    def __init__(self, sa):
        n, k, g = sa.n, sa.k, sa.g
        cq = sa.cq.reshape(n, k)
        cp = sa.cp.reshape(n, k)
        rplus = np.maximum(cp - cq, 0.0)
        z = rplus.sum(axis=1) + (sa.ep - sa.eq)
        fb = z < RESIDUAL_EPS
        cr = np.where(fb[:, None], cp, rplus)
        tpm = sa.tp - sa.ep
        row = {Q_SUM: cq.sum(axis=1), Q_STD: (cq * np.minimum(1.0, cp / cq)).sum(axis=1),
               M_TAIL: sa.eq + tpm, Q_TAIL: sa.tq, Q_TPLUS: sa.eq, P_TPLUS: sa.ep,
               P_TMINUS: tpm, Z_RES: np.where(fb, cp.sum(axis=1) + sa.tp, z),
               R_TPLUS: np.where(fb, sa.ep, sa.ep - sa.eq), R_TMINUS: np.where(fb, tpm, 0.0)}
        assert sorted(row) == list(range(layout.N_ROW_CONSTANTS))
        rowc = np.stack([row[j] for j in range(layout.N_ROW_CONSTANTS)], axis=1)
        tb = TILE_BLOCKS
        self.lq, self.lp, self.lr = (lane_major(a, g, tb) for a in (cq, cp, cr))
        self.lrow = np.ascontiguousarray(np.stack([lane_major(rowc[:, j], g, tb)
                                                   for j in range(rowc.shape[1])]))
        self.ldc = lane_major(sa.dcand.astype(np.int64), g, tb)
        self.lsx = lane_major(sa.std_x, g, tb)
        self.tile_blocks = tb
        self.sa = sa


def prepared(sa) -> Prepared:
    """The Prepared constants of ``sa`` (cached on the object)."""
    pr = getattr(sa, "_prepared", None)
    if pr is None:
        pr = Prepared(sa)
        object.__setattr__(sa, "_prepared", pr)
    return pr


def _args(sa):
    pr = prepared(sa)
    return (pr.tile_blocks, pr.lq, pr.lp, pr.lr, pr.lrow, pr.ldc, pr.lsx)


def _check_inputs(programs, sa) -> None:
    loads = programs.ops[programs.ops < OP_CONST]
    if loads.size and int(loads.max()) >= sa.X.shape[0] and getattr(sa, "missing", ""):
        from evolve.data.tokens import DataError   # lazy: only on this refusal
        raise DataError(sa.missing)
    if loads.size and int(loads.max()) >= sa.X.shape[0]:
        raise ValueError(f"a program reads input opcode {int(loads.max())}, but the candidate "
                         f"matrix has {sa.X.shape[0]} inputs ({', '.join(ALL_INPUT_NAMES)})")


@njit(cache=True)
def _compiled_indices(g, out):
    """The sums' and row constants' indices as compiled into this module's kernels."""
    out[0] = _series_start(layout.ACC_NUM, g)
    out[1] = _series_start(layout.REACH, g)
    out[2] = _series_start(layout.TV_POS, g)
    out[3] = _trailing_index(layout.TAIL, g)
    out[4] = layout.TOKENS
    out[5] = layout.TV
    out[6] = layout.KL
    out[7] = layout.EXTRA
    out[8] = layout.TOKENS_SQ
    for j, c in enumerate((Q_SUM, Q_STD, M_TAIL, Q_TAIL, Q_TPLUS, P_TPLUS, P_TMINUS, Z_RES,
                           R_TPLUS, R_TMINUS)):
        out[9 + j] = c


def layout_indices(g: int) -> list:
    """What ``_compiled_indices`` gives when the compiled code matches ``layout``."""
    L = layout.sums_layout(g)
    return ([L.acc_num.start, L.reach.start, L.tv_pos.start, L.tail, L.tokens, L.tv, L.kl,
             L.extra, L.tokens_sq]
            + [layout.ROW_CONSTANTS.index(n) for n in
               ("q_sum", "q_std", "m_tail", "q_tail", "q_tplus", "p_tplus", "p_tminus",
                "z_res", "r_tplus", "r_tminus")])


_LAYOUT_CHECKED = []


def check_compiled_layout() -> None:
    """Refuse to run kernels compiled for another layout: Numba's cache is keyed on
    this file only, so a cached kernel would keep the old offsets after an edit of
    ``evolve/kernels/layout.py`` (clear the __pycache__ directories then)."""
    if _LAYOUT_CHECKED:
        return
    for g in (1, 2, 5):
        got = np.zeros(19, dtype=np.int64)
        _compiled_indices(g, got)
        if got.tolist() != layout_indices(g):
            raise RuntimeError("the compiled trace kernel was cached for another sums "
                               "layout than evolve/kernels/layout.py; delete the Numba "
                               "cache (__pycache__ of evolve/kernels) and run again")
    _LAYOUT_CHECKED.append(True)


def new_sums(shape, g: int) -> np.ndarray:
    """Zeroed fixed-point sums (*shape, layout.width(g), 2)."""
    return np.zeros((*shape, layout.width(g), 2), dtype=np.int64)


def population_sums(programs, sa, with_kl: bool = True, tail_cap: float = TAIL_OFF,
                    blocks=None) -> np.ndarray:
    """Exact sums for every program, int64 (P, layout.width(g), 2): 128-bit fixed point
    (``kernels.fixed``), in the order of ``evolve.kernels.layout``, over every block of
    ``sa`` or over ``blocks``; the sums of shards add up to the sums of their union.
    ``evolve.kernels.gpu.traces.population_sums`` is this on a device (the same
    arguments, and the device last).

    ``with_kl=False`` skips the KL terms (with them a call takes about 1.3 to 1.6 times
    as long; docs/performance.md); the kl sum is then 0. The tail sum is the reach of
    the slots with TV > tail_cap."""
    if blocks is not None:
        sa = sa.blocks(blocks)
    _check_inputs(programs, sa)
    check_compiled_layout()
    P = len(programs)
    out = new_sums((P,), sa.g)
    if P:
        # programs share a tile while it is in cache, but every thread gets work
        group = max(1, min(GROUP, P // (2 * numba.get_num_threads())))
        threads.run(_population_objectives, -(-P // group), group, programs.ops,
                    programs.consts, programs.starts, programs.lengths, programs.max_stack,
                    sa.X, sa.g, sa.k, *_args(sa), bool(with_kl), float(tail_cap), out)
    return out


def population_objectives(programs, sa, with_kl: bool = True, tail_cap: float = TAIL_OFF,
                          blocks=None) -> np.ndarray:
    """Sums for every program, float64 (P, layout.width(g)); see
    ``spec.objectives_from_sums``."""
    return fixed.to_float(population_sums(programs, sa, with_kl, tail_cap, blocks))


def threshold_sums(h, sa, with_kl: bool = True) -> np.ndarray:
    """Sums of a threshold array over the n*k candidate rows, float64
    (layout.width(g),); see ``spec.threshold_objectives``."""
    h = np.ascontiguousarray(np.broadcast_to(np.asarray(h, dtype=np.float64), (sa.n * sa.k,)))
    check_compiled_layout()
    out = new_sums((), sa.g)
    _threshold_objectives(h, sa.g, sa.k, *_args(sa), bool(with_kl), TAIL_OFF, out)
    return fixed.to_float(out)
