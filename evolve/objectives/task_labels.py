"""Exact objectives on traces of a task with critical-token labels.

A drafted token is *critical* when accepting it changes the task's answer
(``evolve.data.labels``: substituted, continued by the target, checked). At each
drafted row of a recorded block, with ``s`` the standard rule's acceptance
probability (greedy decoding: 1 when the draft is the target's argmax, else 0;
sampling: min(1, p/q)) and ``a`` the rule's (greedy: 1 for an argmax draft, else the
rule's clipped threshold; sampling: the rule inside its scope, the standard rule
outside), the block keeps drafts while the rule accepts. Over the acceptance coins:

- reach_k = prod over j < k of a_j, accepted drafts = sum_k reach_k a_k,
  tokens per call = 1 + accepted drafts (the bonus or correction token);
- the rule accepts a token the standard rule would not with probability
  (a_k - s_k)+ beyond it; that is a *false accept* when the token is critical and a
  harmless extra acceptance otherwise;
- a *false reject* is a harmless token the standard rule could reject (s_k < 1) and
  the rule rejects: probability 1 - a_k;
- critical accepts per answer (per problem the blocks decode): about the share of
  answers a rule changes, when one critical acceptance changes an answer, which is
  what a critical token is.

Every expectation is exact given the recorded blocks (as the trace objectives are:
the blocks are the standard rule's). Rows the standard rule never rejects (s = 1)
need no label; every other reached row must have one (a row without is refused by
``check_labels``).

``sums(h, arrays)`` gives, per program (rows of ``h``, the thresholds of the drafted
rows), the totals the objectives read (``SUMS``), summed over blocks. Each block's
values are computed slot after slot and rounded once to 128-bit fixed point
(``evolve.kernels.fixed``, as the trace kernels do), and the blocks' integers are
added: any chunking of the rows, any order and any number of shards give the same
totals bit for bit (``fixed_sums`` of the parts, added with ``fixed.total``, then
``from_fixed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from evolve.data.decode import clipped
from evolve.data.distance import bins
from evolve.kernels import fixed

UNLABELED = -1
SUMS = ("blocks", "tokens", "reached", "accepted", "critical_accepted", "harmless_extra",
        "false_rejects", "answers")
BLOCK_SUMS = SUMS[1:7]        # summed block by block in fixed point; blocks, answers: counts


@dataclass(frozen=True)
class TaskArrays:
    """The drafted rows of a task split as the objectives read them (block order: g
    consecutive rows a block): ``s`` the standard acceptance, ``inside`` whether the rule
    decides the row (its scope; greedy: a non-argmax draft), ``std_outside`` what is
    accepted where it does not (greedy: 1; sampling: s), ``critical`` 1 / 0 / -1
    (UNLABELED)."""
    g: int
    s: np.ndarray
    inside: np.ndarray
    outside: np.ndarray
    critical: np.ndarray
    answers: int = 0            # the problems (answers) the blocks decode

    @property
    def n_blocks(self) -> int:
        return self.s.size // self.g

    def blocks(self, lo: int, hi: int) -> "TaskArrays":
        """Blocks ``lo`` to ``hi`` (their rows; ``answers`` kept: it is the split's)."""
        r = slice(lo * self.g, hi * self.g)
        return TaskArrays(self.g, self.s[r], self.inside[r], self.outside[r],
                          self.critical[r], self.answers)


def acceptance(h, ta: TaskArrays) -> np.ndarray:
    """The rule's acceptance of every drafted row, (P, N), from thresholds (P, N)."""
    return np.where(ta.inside[None, :], clipped(h), ta.outside[None, :])


def sums(h, ta: TaskArrays) -> np.ndarray:
    """Per program, the ``SUMS`` totals (float64, (P, len(SUMS)))."""
    return from_fixed(fixed_sums(h, ta), ta.n_blocks, ta.answers)


def fixed_sums(h, ta: TaskArrays) -> np.ndarray:
    """Per program, the ``BLOCK_SUMS`` totals as fixed-point integers, int64
    (P, len(BLOCK_SUMS), 2): the sums of parts of a split add up (``fixed.total``) to
    the whole split's, bit for bit."""
    h = np.atleast_2d(np.asarray(h, dtype=np.float64))
    a = np.ascontiguousarray(acceptance(h, ta))
    return _block_sums(a, np.ascontiguousarray(ta.s, dtype=np.float64),
                       np.ascontiguousarray(ta.critical, dtype=np.int8), int(ta.g))


def from_fixed(fx: np.ndarray, blocks: int, answers: int) -> np.ndarray:
    """``SUMS`` rows (float64) from ``fixed_sums`` integers and the split's counts."""
    vals = fixed.to_float(fx)
    out = np.empty((vals.shape[0], len(SUMS)))
    out[:, 0] = blocks
    out[:, 1:7] = vals
    out[:, 7] = answers
    return out


@njit(cache=True, nogil=True)
def _block_sums(a, s, crit, g):
    """The ``BLOCK_SUMS`` of each block of acceptances ``a`` (P, n), slot after slot in
    block order (reach_k = prod_{j<k} a_j), each block's value added in fixed point."""
    P, n = a.shape
    out = np.zeros((P, 6, 2), dtype=np.int64)
    for p in range(P):
        acc = out[p]
        for b in range(n // g):
            reach = 1.0
            reached = 0.0
            accepted = 0.0
            crit_acc = 0.0
            harmless = 0.0
            rejects = 0.0
            for k in range(g):
                i = b * g + k
                ak = a[p, i]
                reached += reach
                extra = reach * max(ak - s[i], 0.0)
                if crit[i] == 1:
                    crit_acc += extra
                elif crit[i] == 0:
                    harmless += extra
                    if s[i] < 1.0:
                        rejects += reach * (1.0 - ak)
                reach = reach * ak
                accepted += reach
            fixed.add_to(acc, 0, 1.0 + accepted)
            fixed.add_to(acc, 1, reached)
            fixed.add_to(acc, 2, accepted)
            fixed.add_to(acc, 3, crit_acc)
            fixed.add_to(acc, 4, harmless)
            fixed.add_to(acc, 5, rejects)
    return out


def critical_by_distance(h, ta: TaskArrays, distance) -> dict:
    """Where on the recorded path a rule (thresholds ``h`` of one program, (N,) or (1, N))
    changes answers, by distance from the prompt (``evolve.data.distance``; ``distance``:
    each drafted row's, 0 the first token after the prompt): per bin, the drafts the
    standard rule could reject that carry a label (``labelled``), the share of them that
    are critical (``critical_rate``: the task's own, whatever the rule) and the rule's
    accepted critical tokens per answer from that bin (``critical_per_answer``: the bins
    add up to the objective's). Exact given the recorded blocks, as ``sums`` is."""
    a = acceptance(np.atleast_2d(np.asarray(h, dtype=np.float64))[:1], ta)[0]
    A = a.reshape(-1, ta.g)
    reach = np.ones_like(A)
    if ta.g > 1:
        reach[:, 1:] = np.cumprod(A[:, :-1], axis=1)
    extra = (reach * np.maximum(A - ta.s.reshape(-1, ta.g), 0.0)).reshape(-1)
    could = (ta.s < 1.0) & (ta.critical != UNLABELED)
    out = {}
    for label, m in bins(distance):
        n = int((could & m).sum())
        out[label] = {
            "labelled": n,
            "critical_rate": float((ta.critical[could & m] == 1).mean()) if n else None,
            "critical_per_answer": float(extra[m & (ta.critical == 1)].sum()
                                         / max(ta.answers, 1))}
    return out


def measures(rows: np.ndarray) -> dict:
    """Tokens per call, critical accepts per token (the rate a budget holds), false
    rejects per token, from ``sums`` rows."""
    rows = np.atleast_2d(rows)
    i = {k: j for j, k in enumerate(SUMS)}
    tok, reached = rows[:, i["tokens"]], rows[:, i["reached"]]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_answer = rows[:, i["critical_accepted"]] / rows[:, i["answers"]]
    return {"tokens_per_call": tok / rows[:, i["blocks"]],
            "critical_per_token": rows[:, i["critical_accepted"]] / tok,
            "critical_per_answer": per_answer,
            "harmless_extra_per_token": rows[:, i["harmless_extra"]] / tok,
            "false_rejects_per_token": rows[:, i["false_rejects"]] / tok,
            "accept_rate": rows[:, i["accepted"]] / reached,
            "false_accept_rate": rows[:, i["critical_accepted"]] / reached,
            "false_reject_rate": rows[:, i["false_rejects"]] / reached}


def seed_fitness(m: dict) -> np.ndarray:
    """The seed's metric on the labels, per reached drafted row: the accept rate times
    quality, quality = max(0, 1 - (10 false accepts + 0.1 false rejects) per row), where
    a false accept is an accepted critical token beyond the standard rule and a false
    reject a rejected harmless one; half the quality when it is below 0.95."""
    q = np.maximum(0.0, 1.0 - (10.0 * m["false_accept_rate"] + 0.1 * m["false_reject_rate"]))
    return np.where(q >= 0.95, m["accept_rate"] * q, 0.5 * q)


def check_labels(ta: TaskArrays, where: str) -> None:
    """Every row the standard rule could reject carries a label (ValueError naming the
    first row without one)."""
    bad = np.flatnonzero((ta.s < 1.0) & (ta.critical == UNLABELED))
    if bad.size:
        raise ValueError(f"{where}: field 'critical' row {int(bad[0])}: no label for a draft "
                         "the standard rule could reject")
