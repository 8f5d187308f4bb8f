"""The one definition of where the trace kernel's sums and per-row constants live.

Sums. For every program the trace kernel (``evolve.kernels.speculative``)
returns one row of ``width(g)`` exact sums over the blocks of a split (g: the
block size), in this order:

    tokens, tv, kl, extra, tokens_sq           SCALARS: one value each
    acc_num[g], reach[g], tv_pos[g]            SERIES: one value per block position
    tail                                       TRAILING: one value

``tokens`` is the summed expected tokens per target call, ``tv``, ``kl`` and
``extra`` the reach-weighted TV, KL and extra acceptance mass, ``tokens_sq`` the
summed squares of the blocks' tokens (for the standard error); per block
position s, ``acc_num[s]`` and ``reach[s]`` are the numerator and denominator
of the acceptance rate (reach-weighted alpha, and the reach itself) and
``tv_pos[s]`` the reach-weighted slot TV; ``tail`` is the reach of the slots
whose TV exceeds the tail cap.

Everything that writes or reads such a row goes through this module: the
kernel through the integer constants and the offset functions below (Numba
reads module-level integers as compile-time constants and inlines the offset
functions, see ``kernels.speculative``), Python readers through
``sums_layout(g)``, whose named fields (ints and slices) index a row or, as
``sums[:, L.reach]``, a population's rows. Adding a sum is one name in one of
the tuples here; every offset follows.

Per-row constants. ``ROW_CONSTANTS`` names the rule-independent constants the
kernel reads per drafted position (``Prepared.lrow``, one row per constant);
each has a module-level index (``Q_SUM`` ... ``R_TMINUS``).

Also here: ``TAIL_OFF``, the tail cap that means "no tail sum", and the fixed
point of the token kernel's expected sums (``EXPECTED_SCALE``, ``quantise``).

This module imports numpy only (no Numba, nothing of the project), so objectives
and reports can read it cheaply. (The decoder's ``RESIDUAL_EPS`` has its one definition in
``evolve.data.decode``, next to the residual it guards.)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TAIL_OFF = 2.0           # a slot-TV tail cap no slot exceeds (slot TV <= 1): no tail sum

# The token kernel's expected sums are integers in this fixed-point unit.
EXPECTED_SCALE = float(2 ** 32)


def quantise(p) -> np.ndarray:
    """Probabilities in [0, 1] to fixed point (truncation, as the kernels do)."""
    return (np.asarray(p, dtype=np.float64) * EXPECTED_SCALE).astype(np.int64)


# ------------------------------------------------------------------- sums

SCALARS = ("tokens", "tv", "kl", "extra", "tokens_sq")
SERIES = ("acc_num", "reach", "tv_pos")
TRAILING = ("tail",)

# Indices the kernel uses (compile-time constants in jitted code).
TOKENS, TV, KL, EXTRA, TOKENS_SQ = (SCALARS.index(n) for n in
                                    ("tokens", "tv", "kl", "extra", "tokens_sq"))
ACC_NUM, REACH, TV_POS = (SERIES.index(n) for n in ("acc_num", "reach", "tv_pos"))
TAIL = TRAILING.index("tail")
N_SCALARS = len(SCALARS)
N_SERIES = len(SERIES)
N_TRAILING = len(TRAILING)


def series_start(series: int, g: int) -> int:
    """Index of block position 0 of the series ``series`` (ACC_NUM, REACH, TV_POS)."""
    return N_SCALARS + series * g


def trailing_index(i: int, g: int) -> int:
    """Index of the trailing sum ``i`` (TAIL)."""
    return N_SCALARS + N_SERIES * g + i


def width(g: int) -> int:
    """Number of sums of one program for block size g."""
    return N_SCALARS + N_SERIES * g + N_TRAILING


@dataclass(frozen=True)
class SumsLayout:
    """Named positions of one program's sums for block size ``g``: ints for the
    scalar sums, slices of length g for the per-block-position series."""
    g: int
    width: int
    tokens: int
    tv: int
    kl: int
    extra: int
    tokens_sq: int
    acc_num: slice
    reach: slice
    tv_pos: slice
    tail: int

    def fields(self) -> dict:
        """Field name -> int or slice, in row order."""
        return {n: getattr(self, n) for n in SCALARS + SERIES + TRAILING}


@lru_cache(maxsize=None)
def sums_layout(g: int) -> SumsLayout:
    """The layout of the sums for block size ``g`` (g >= 1)."""
    g = int(g)
    f = {n: i for i, n in enumerate(SCALARS)}
    for j, n in enumerate(SERIES):
        s0 = series_start(j, g)
        f[n] = slice(s0, s0 + g)
    for i, n in enumerate(TRAILING):
        f[n] = trailing_index(i, g)
    return SumsLayout(g=g, width=width(g), **f)


# ------------------------------------------------------ per-row constants

ROW_CONSTANTS = (
    "q_sum",       # sum over the candidates of q
    "q_std",       # sum over the candidates of q min(1, p/q): the standard rule's mass
    "m_tail",      # q(T+) + p(T-): the tail's acceptance mass (sum over T of min(p, q))
    "q_tail",      # q(T)
    "q_tplus",     # q(T+)
    "p_tplus",     # p(T+)
    "p_tminus",    # p(T-)
    "z_res",       # the residual normaliser (Z, or the total p on fallback rows)
    "r_tplus",     # the residual weight of the tail bin T+
    "r_tminus",    # the residual weight of the tail bin T-
)
(Q_SUM, Q_STD, M_TAIL, Q_TAIL, Q_TPLUS, P_TPLUS, P_TMINUS, Z_RES, R_TPLUS,
 R_TMINUS) = (ROW_CONSTANTS.index(n) for n in
              ("q_sum", "q_std", "m_tail", "q_tail", "q_tplus", "p_tplus", "p_tminus",
               "z_res", "r_tplus", "r_tminus"))
N_ROW_CONSTANTS = len(ROW_CONSTANTS)
