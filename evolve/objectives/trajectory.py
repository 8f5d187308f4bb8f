"""Trajectory-aware offline estimates: a rule's free-running numbers from standard traces.

The offline objectives (``evolve.objectives.spec``) score every recorded block
from the context the *standard* rule produced. That is exact for the first block
of a sequence; later blocks start, in free-running decoding, from the rule's own
trajectory, whose contexts are distributed differently (a lenient rule steers
text towards what the draft predicts well). The traces hold enough to correct
for that exactly, by importance weighting whole trajectories:

Within a block, a rule changes only the accept/reject decisions. The draft's
samples, the residual ``norm(max(0, p - q))`` drawn from at the first rejection
and the bonus token drawn from ``p`` have the same distributions under every
rule given the history. So the likelihood ratio of the recorded block (the
standard rule accepted ``n`` drafts, then rejected draft ``n + 1`` if ``n < g``)
under a rule R against the standard rule S is

    LR = prod_{j <= n} a_R(x_j) / a_S(x_j) * [(1 - a_R(x_{n+1})) / (1 - a_S(x_{n+1}))]

(``a`` the acceptance probability of the drafted token: the rule's clipped
threshold among the draft's top-k, ``min(1, p/q)`` elsewhere), and block ``b``
of a sequence, weighted by ``w_b = prod_{b' < b} LR_b'``, has under S the
distribution it has under R. Each block's own expected tokens, TV and KL are
the exact Rao-Blackwellised terms of ``spec`` at its recorded context, so

    tokens/call under R = mean_b E_S[w_b T_R(c_b)],

estimated self-normalised per block index (the weights of each block index
average to 1 in expectation), with a standard error by sequence. For the
standard rule every weight is 1 and the estimate is the plain offline one.
The weights' spread grows with the number of blocks and how far a rule is
from standard; ``effective_sequences`` (Kish) says how many sequences the
estimate is worth.

This module is the numpy reference. ``evolve run --objective speed --trajectory``
optimises the same estimate for whole populations (``evolve.kernels.trajectory``,
``evolve.objectives.trajectory_objective``); the tests hold the two equal.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from evolve.objectives import spec


@dataclass(frozen=True)
class TraceBlocks:
    """What the weights need besides ``TraceArrays``: per block, its sequence, its index
    in the sequence, and the standard rule's recorded accepted count."""
    sequence: np.ndarray       # (nb,) int64
    block: np.ndarray          # (nb,) int64
    n_std: np.ndarray          # (nb,) int64 recorded standard acceptances (0..g)

    @classmethod
    def from_split(cls, ts) -> "TraceBlocks":
        c = ts.columns
        g = int(ts.meta["block_size"])
        acc = np.asarray(c["baseline_accepts"], dtype=bool).reshape(-1, g)
        n_std = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
        return cls(np.asarray(c["sequence"], np.int64)[::g],
                   np.asarray(c["block_index"], np.int64)[::g], n_std.astype(np.int64))


@dataclass(frozen=True)
class TrajectoryEstimate:
    tokens_per_call: float
    tokens_se: float
    tv_per_token: float
    kl_per_token: float
    effective_sequences: float     # Kish effective size of the last block's weights
    sequences: int

    def to_dict(self) -> dict:
        return asdict(self)


def block_weights(sa: spec.TraceArrays, tb: TraceBlocks, a_x: np.ndarray) -> np.ndarray:
    """w_b (nb,): the likelihood ratio, rule against standard, of every recorded block
    of the sequence before block b (1 for first blocks; 0 after a block the rule could
    not have decoded, e.g. a rejection where it accepts surely)."""
    g, nb = sa.g, sa.n_blocks
    aR = a_x.reshape(nb, g)
    aS = sa.std_x.reshape(nb, g)
    j = np.arange(g)[None, :]
    n = tb.n_std[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        acc = np.where(j < n, aR / aS, 1.0)
        rej = np.where(j == n, (1.0 - aR) / (1.0 - aS), 1.0)
    lr = (acc * rej).prod(axis=1)
    s_idx, b_idx, S, B = _grid(tb)
    L = np.ones((S, B))
    L[s_idx, b_idx] = lr
    cum = np.ones((S, B))
    cum[:, 1:] = np.cumprod(L[:, :-1], axis=1)
    return cum[s_idx, b_idx]


def _grid(tb: TraceBlocks):
    """Sequence and block-index positions of every block on a (sequences, blocks) grid."""
    _, s_idx = np.unique(tb.sequence, return_inverse=True)
    _, b_idx = np.unique(tb.block, return_inverse=True)
    return s_idx, b_idx, int(s_idx.max()) + 1, int(b_idx.max()) + 1


def sequence_tokens(sa: spec.TraceArrays, tb: TraceBlocks, h, trajectory: bool = True):
    """Per sequence, its linearised contribution to the estimate of tokens per call
    (their mean is the estimate; their spread gives a standard error by sequence, also
    of paired differences); with ``trajectory=False`` every weight is 1 (the plain
    offline estimate). Also returns the block sums, the weights and the weight grid."""
    terms = spec.position_terms(sa, h)
    b = spec.block_sums(sa, terms)
    w = block_weights(sa, tb, terms.a_x) if trajectory else np.ones(sa.n_blocks)
    s_idx, b_idx, S, B = _grid(tb)
    W = np.zeros((S, B))
    T = np.zeros((S, B))
    W[s_idx, b_idx] = w
    T[s_idx, b_idx] = b["tokens"]
    wsum = W.sum(axis=0)                              # per block index
    with np.errstate(divide="ignore", invalid="ignore"):     # no weight left: NaN
        means = (W * T).sum(axis=0) / wsum
        infl = means.mean() + ((W * (T - means[None, :])) / (wsum[None, :] / S)).mean(axis=1)
    return infl, b, w, W


def estimate(sa: spec.TraceArrays, tb: TraceBlocks, h) -> TrajectoryEstimate:
    """Free-running tokens per call, TV and KL per token of the thresholds ``h``."""
    return summary(sequence_tokens(sa, tb, h))


def summary(seq_tokens) -> TrajectoryEstimate:
    """The estimate from what ``sequence_tokens`` returned (no second pass)."""
    infl, b, w, W = seq_tokens
    S = infl.size
    se = float(infl.std(ddof=1) / np.sqrt(S)) if S > 1 else float("nan")
    tot = (w * b["tokens"]).sum()
    last = W[:, -1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ess = float(last.sum() ** 2 / (last ** 2).sum())
    return TrajectoryEstimate(float(infl.mean()), se, float((w * b["tv"]).sum() / tot),
                              float((w * b["kl"]).sum() / tot), ess, S)


def paired_difference(sa: spec.TraceArrays, tb: TraceBlocks, h_a, h_b) -> tuple[float, float]:
    """Trajectory-aware tokens per call of rule a minus rule b, with a standard error by
    sequence (the same recorded blocks weighted for each)."""
    d = sequence_tokens(sa, tb, h_a)[0] - sequence_tokens(sa, tb, h_b)[0]
    return float(d.mean()), float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else np.nan
