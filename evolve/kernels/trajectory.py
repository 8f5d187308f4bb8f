"""Numba kernel: the trajectory-aware (importance-weighted) speed objective of a population.

``evolve.objectives.trajectory`` estimates a rule's free-running tokens per call,
TV and KL from standard-rule traces by weighting block ``b`` of a sequence with
``w_b``, the product of the likelihood ratios (rule against standard) of the
sequence's earlier blocks. This kernel computes, for every program in one pass
over the split, the sums that estimate reads, next to the plain sums of
``evolve.kernels.speculative`` (the same tile scorer, ``_tile_sums``, so the plain
sums are the very integers ``population_sums`` gives).

Per block the scorer leaves the block's tokens, TV and KL in its scratch; from the
tile's clipped thresholds this kernel takes the rule's acceptance probability of
every recorded draft and forms the block's likelihood ratio

    LR_b = prod_{j < n} a_R(x_j) / a_S(x_j) * [(1 - a_R(x_n)) / (1 - a_S(x_n))  if n < g]

(``n``: the standard rule's recorded acceptances). A program keeps its running
weight ``w`` while it walks the blocks in order: ``w = 1`` at a sequence's first
block, ``w *= LR_b`` after block ``b``. The same float operations in the same order
as ``trajectory.block_weights``, so the weights are those of the numpy reference.

Per program the trajectory sums (``width(B)``, B block indices) are

    [TOKENS, TV, KL]     sum over blocks of w tokens_b, w tv_b, w kl_b
    OVERFLOW             the number of blocks with w > WEIGHT_LIMIT (or NaN)
    [W + i]              per block index i: sum of w
    [WT + i]             per block index i: sum of w tokens_b
    [W2 + i]             per block index i: sum of w^2

each block's terms rounded once to 128-bit fixed point (``kernels.fixed``) and added
as integers, so they are the same in one pass or summed over shards, whatever the
thread count or tiling. Fixed point saturates at 2^30, so w^2 is exact only for
w <= WEIGHT_LIMIT = 2^15; ``OVERFLOW`` counts the blocks past it and the objective
treats any as an undefined estimate (one such sequence outweighs 2^15 typical
ones: the estimate rests on it alone).

A sequence's running weight needs all its blocks in one pass, in order: the kernel
reads the blocks of a split or a shard as they are stored, so a sequence must not
span two shards (``evolve.objectives.trajectory_objective`` checks that when it
loads a sharded split and refuses it otherwise).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from evolve.kernels import layout, threads
from evolve.kernels.fixed import add_to
from evolve.kernels.interpreter import new_stack, run_program
from evolve.kernels.speculative import (GROUP, VALS, _args, _check_inputs, _lanes, _tile_sums,
                                        check_compiled_layout, new_sums)

TOKENS, TV, KL, OVERFLOW = 0, 1, 2, 3
N_HEAD = 4
WEIGHT_LIMIT = float(2 ** 15)      # w^2 <= fixed.LIMIT (2^30): exact


def width(n_index: int) -> int:
    """Trajectory sums of one program for ``n_index`` block indices."""
    return N_HEAD + 3 * n_index


def offsets(n_index: int) -> tuple:
    """Start of the per-block-index series W, WT, W2."""
    return N_HEAD, N_HEAD + n_index, N_HEAD + 2 * n_index


@njit(cache=True, nogil=True, inline="always")
def _ratio(num, den):
    """num / den; 0/0 (a draft the standard rule keeps or rejects surely, recorded
    otherwise) is 1 when the rule agrees, else +inf (an overflowing weight)."""
    if den != 0.0:
        return num / den
    return 1.0 if num == 0.0 else np.inf


@njit(cache=True, nogil=True)
def _tile_weights(H, nb, g, k, ldc, lsx, poff, b0, sc, nstd, bidx, first, w, nidx, acc, a0):
    """Add the trajectory sums of the nb blocks of a scored tile (their tokens, TV and
    KL in ``sc``, see ``_tile_sums``) to acc[a0:], carrying the running weight ``w``
    from block to block; returns the weight after the tile's last block."""
    o_w, o_wt, o_w2 = N_HEAD, N_HEAD + nidx, N_HEAD + 2 * nidx
    for b in range(nb):
        gb = b0 + b
        if first[gb]:
            w = 1.0
        tok = sc[VALS + layout.TOKENS, b]
        i = bidx[gb]
        add_to(acc, a0 + TOKENS, w * tok)
        add_to(acc, a0 + TV, w * sc[VALS + layout.TV, b])
        add_to(acc, a0 + KL, w * sc[VALS + layout.KL, b])
        if not w <= WEIGHT_LIMIT:
            add_to(acc, a0 + OVERFLOW, 1.0)
        else:
            add_to(acc, a0 + o_w + i, w)
            add_to(acc, a0 + o_wt + i, w * tok)
            add_to(acc, a0 + o_w2 + i, w * w)
        n = nstd[gb]
        lr = 1.0
        for s in range(g):
            if s > n:
                break
            r = poff + s * nb + b
            a_s = lsx[r]
            dc = ldc[r]
            a_r = H[(s * k + dc) * nb + b] if dc >= 0 else a_s
            if s < n:
                lr *= _ratio(a_r, a_s)
            else:
                lr *= _ratio(1.0 - a_r, 1.0 - a_s)
        w = w * lr
    return w


@njit(cache=True, nogil=True)
def _trajectory_items(i0, i1, group, ops, consts, starts, lengths, max_stack, X, g, k,
                      tile_blocks, lq, lp, lr, lrow, ldc, lsx, with_kl, cap, nstd, bidx, first,
                      nidx, out, tout):
    for gi in range(i0, i1):
        p0 = gi * group
        p1 = min(starts.shape[0], p0 + group)
        n_blocks = ldc.shape[0] // g
        wd = tile_blocks * g * k
        C = out.shape[1]
        T = tout.shape[1]
        stack, slot = new_stack(max_stack, wd)
        H = np.empty(wd, dtype=np.float64)
        sc = np.empty((VALS + C, tile_blocks), dtype=np.float64)
        acc = np.zeros(((p1 - p0) * C, 2), dtype=np.int64)
        tacc = np.zeros(((p1 - p0) * T, 2), dtype=np.int64)
        wrun = np.ones(p1 - p0, dtype=np.float64)
        for b0 in range(0, n_blocks, tile_blocks):
            nb = min(tile_blocks, n_blocks - b0)
            for pi in range(p0, p1):
                row = run_program(ops, consts, starts[pi], lengths[pi], X, b0 * g * k,
                                  nb * g * k, stack, slot)
                _lanes(stack, row, 0, nb, g, k, H)
                _tile_sums(H, nb, g, k, lq, lp, lr, lrow, ldc, lsx, b0 * g * k, b0 * g,
                           with_kl, cap, sc, acc, (pi - p0) * C)
                wrun[pi - p0] = _tile_weights(H, nb, g, k, ldc, lsx, b0 * g, b0, sc, nstd,
                                              bidx, first, wrun[pi - p0], nidx, tacc,
                                              (pi - p0) * T)
        for pi in range(p0, p1):
            for c in range(C):
                out[pi, c, 0] = acc[(pi - p0) * C + c, 0]
                out[pi, c, 1] = acc[(pi - p0) * C + c, 1]
            for c in range(T):
                tout[pi, c, 0] = tacc[(pi - p0) * T + c, 0]
                tout[pi, c, 1] = tacc[(pi - p0) * T + c, 1]


def population_sums(programs, sa, blocks, n_index: int, with_kl: bool = True,
                    tail_cap: float = layout.TAIL_OFF) -> tuple[np.ndarray, np.ndarray]:
    """Exact sums for every program: the plain ones (int64 (P, layout.width(g), 2), the
    integers ``kernels.speculative.population_sums`` gives) and the trajectory ones
    (int64 (P, width(n_index), 2)). ``blocks``: per block of ``sa``, ``n_std`` (recorded
    standard acceptances), ``index`` (block index in its sequence, < n_index) and
    ``first`` (the first block of its sequence), int64 / bool arrays of n_blocks."""
    _check_inputs(programs, sa)
    check_compiled_layout()
    nstd, bidx, first = (np.ascontiguousarray(a) for a in blocks)
    nb = sa.n_blocks
    if not (nstd.shape == bidx.shape == first.shape == (nb,)):
        raise ValueError(f"blocks: expected 3 arrays of n_blocks ({nb}) values")
    if nb and (int(bidx.min()) < 0 or int(bidx.max()) >= n_index):
        raise ValueError(f"n_index {n_index}: block indices reach {int(bidx.max())}")
    P = len(programs)
    out = new_sums((P,), sa.g)
    tout = np.zeros((P, width(n_index), 2), dtype=np.int64)
    if P:
        group = max(1, min(GROUP, P // (2 * numba.get_num_threads())))
        threads.run(_trajectory_items, -(-P // group), group, programs.ops, programs.consts,
                    programs.starts, programs.lengths, programs.max_stack, sa.X, sa.g, sa.k,
                    *_args(sa), bool(with_kl), float(tail_cap), nstd.astype(np.int64),
                    bidx.astype(np.int64), first.astype(np.bool_), int(n_index), out, tout)
    return out, tout
