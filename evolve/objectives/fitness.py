"""Fitness helpers of the trace objectives: the speed score within a budget, and
the slot-TV cap the kernels sum the tail reach above.

``speed_fitness`` gives tokens per call where a rule is within its budget (and its
caps) and 1 - (its largest excess, at most 1) otherwise: below every feasible rule
(a rule decodes at least one token per call), less the further it is over.
"""

from __future__ import annotations

import numpy as np

from evolve.kernels.layout import TAIL_OFF


def speed_fitness(tokens, tv, budget, tv_pos=None, cap: float = 1.0, tail_excess=None):
    """Tokens per call where TV per token <= budget (and, with ``tv_pos``, every block
    position's slot TV <= cap; with ``tail_excess``, that is <= 0);
    1 - (the largest excess, at most 1) otherwise."""
    tokens = np.asarray(tokens, dtype=np.float64)
    excess = np.asarray(tv, dtype=np.float64) - budget
    if tv_pos is not None:
        excess = np.maximum(excess, np.asarray(tv_pos, dtype=np.float64).max(axis=-1) - cap)
    if tail_excess is not None:
        excess = np.maximum(excess, tail_excess)
    return np.where(excess <= 0.0, tokens, 1.0 - np.minimum(excess, 1.0))


def tail_cap(config) -> float:
    """The slot-TV cap the kernel sums the tail reach above (--cap-tv-p99)."""
    return config.tv_p99_cap if config is not None and config.tv_p99_cap < 1.0 else TAIL_OFF
