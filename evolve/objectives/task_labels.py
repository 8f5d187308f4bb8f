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
rows), the totals the objectives read (``SUMS``), summed over blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evolve.data.decode import clipped

UNLABELED = -1
SUMS = ("blocks", "tokens", "reached", "accepted", "critical_accepted", "harmless_extra",
        "false_rejects", "answers")


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


def acceptance(h, ta: TaskArrays) -> np.ndarray:
    """The rule's acceptance of every drafted row, (P, N), from thresholds (P, N)."""
    return np.where(ta.inside[None, :], clipped(h), ta.outside[None, :])


def sums(h, ta: TaskArrays) -> np.ndarray:
    """Per program, the ``SUMS`` totals (float64, (P, len(SUMS)))."""
    h = np.atleast_2d(np.asarray(h, dtype=np.float64))
    P, g = h.shape[0], ta.g
    a = acceptance(h, ta).reshape(P, -1, g)
    s = np.broadcast_to(ta.s.reshape(1, -1, g), a.shape)
    c = np.broadcast_to(ta.critical.reshape(1, -1, g), a.shape)
    kept = np.cumprod(a, axis=2)                       # reach_(k+1): all of 0..k kept
    reach = np.concatenate([np.ones_like(kept[:, :, :1]), kept[:, :, :-1]], axis=2)
    extra = reach * np.maximum(a - s, 0.0)
    could = s < 1.0
    out = np.empty((P, len(SUMS)))
    out[:, 0] = a.shape[1]
    out[:, 1] = a.shape[1] + kept.sum(axis=(1, 2))
    out[:, 2] = reach.sum(axis=(1, 2))
    out[:, 3] = kept.sum(axis=(1, 2))
    out[:, 4] = (extra * (c == 1)).sum(axis=(1, 2))
    out[:, 5] = (extra * (c == 0)).sum(axis=(1, 2))
    out[:, 6] = (reach * (1.0 - a) * ((c == 0) & could)).sum(axis=(1, 2))
    out[:, 7] = ta.answers
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
