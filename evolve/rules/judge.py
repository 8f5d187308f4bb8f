"""A learned judge, as AutoJudge learns one: a logistic regression of the critical-token
labels on the rule inputs, fit on train, that accepts a draft the standard rule could
reject when its predicted probability of being critical is below a threshold λ.

AutoJudge's classifier reads the models' hidden states; this one reads the twelve
probability features every rule here reads (``evolve.objectives.task_data.drafted_matrix``:
draft and target probability, position, entropies, top-token match, block position,
p_max, q_max and the slot's TV and KLs), standardised, with an intercept. The fit is
Newton's method on the L2-regularised log-likelihood (a few dozen features: a small
dense system, no library needed). The rule's threshold of a row is 1 (accept) where
P(critical) < λ and the standard rule's otherwise, so it is lenient, and λ is tuned on
valid to a critical budget like any family (``evolve.rules.task_tuning``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evolve.lang.features import SLOT_SIGNATURE
from evolve.lang.primitives import INPUT_INDEX
from evolve.objectives import task_labels as TL
from evolve.rules.adapters import vector_rule

L2 = 1e-2
NEWTON_STEPS = 50
GRID = (0.0, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
BISECT_STEPS = 20
ROWS = [INPUT_INDEX[name] for name in SLOT_SIGNATURE]    # its inputs' rows of a task matrix


@dataclass(frozen=True)
class Judge:
    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray        # intercept first

    def probability(self, X: np.ndarray) -> np.ndarray:
        """P(critical) of every row of a matrix of its inputs (12, N: ``SLOT_SIGNATURE``)."""
        Z = (X.T - self.mean) / self.scale
        return 1.0 / (1.0 + np.exp(-(self.weights[0] + Z @ self.weights[1:])))

    def to_dict(self) -> dict:
        return {"inputs": list(SLOT_SIGNATURE), "mean": self.mean.tolist(),
                "scale": self.scale.tolist(), "weights": self.weights.tolist(),
                "l2": L2}


def fit(td) -> Judge:
    """The regression on the labelled rows of a task split (``TaskData``)."""
    labelled = td.arrays.critical != TL.UNLABELED
    return fit_xy(td.X[ROWS][:, labelled].T,
                  (td.arrays.critical[labelled] == 1).astype(np.float64))


def fit_xy(X: np.ndarray, y: np.ndarray) -> Judge:
    """The regression of 0/1 targets ``y`` (n,) on the rows of ``X`` (n, inputs), each
    input standardised (one that does not vary keeps its scale 1)."""
    mean = X.mean(axis=0) if X.size else np.zeros(X.shape[1])
    scale = X.std(axis=0) if X.size else np.ones(X.shape[1])
    scale = np.where(scale > 0, scale, 1.0)
    A = np.column_stack([np.ones(len(y)), (X - mean) / scale])
    w = np.zeros(A.shape[1])
    reg = np.full(A.shape[1], L2)
    reg[0] = 0.0
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(A @ w)))
        grad = A.T @ (p - y) + reg * w
        H = (A * (p * (1 - p))[:, None]).T @ A + np.diag(reg + 1e-9)
        step = np.linalg.solve(H, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return Judge(mean, scale, w)


def _standard(d, t, greedy: bool) -> np.ndarray:
    """The standard rule's thresholds of drafts of probabilities d (draft) and t (target)."""
    d = np.asarray(d, dtype=np.float64)
    return np.zeros(d.shape) if greedy else np.minimum(1.0, np.asarray(t, np.float64) / d)


def thresholds(model: Judge, td, lam: float) -> np.ndarray:
    """The rule's thresholds of a split's rows: 1 where P(critical) < λ, else the
    standard rule's (greedy: 0, a draft that is not the target's argmax is rejected;
    sampling: min(1, t/d))."""
    X = td.X[ROWS]
    return np.where(model.probability(X) < lam, 1.0,
                    _standard(X[SLOT_SIGNATURE.index("draft_prob")],
                              X[SLOT_SIGNATURE.index("target_prob")], td.greedy))


def tune(model: Judge, td, budget: float):
    """(λ, the valid sums row) with the most tokens per call within the budget, or None."""
    rows = np.vstack([td.thresholds_sums(thresholds(model, td, lam)) for lam in GRID])
    m = TL.measures(rows)
    ok = m["critical_per_answer"] <= budget
    fit_ = np.flatnonzero(ok)
    if fit_.size == 0:
        return None
    i = max(fit_, key=lambda j: (m["tokens_per_call"][j], -m["critical_per_answer"][j], -j))
    best, row = GRID[i], rows[i]
    if i + 1 < len(GRID) and not ok[i + 1]:
        lo, hi = GRID[i], GRID[i + 1]
        for _ in range(BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            r = td.thresholds_sums(thresholds(model, td, mid))
            mm = TL.measures(r)
            if mm["critical_per_answer"][0] <= budget:
                lo = mid
                if mm["tokens_per_call"][0] > TL.measures(row)["tokens_per_call"][0]:
                    best, row = mid, r[0]
            else:
                hi = mid
    return float(best), np.atleast_2d(row)[0]


class Design:
    """A judge's inputs as a matrix (n, k) from named columns: each name as it is, but
    ``token_class`` one-hot over the classes given (seen on train; the class codes are
    not an order). The default is the twelve slot inputs (``SLOT_SIGNATURE``)."""

    def __init__(self, names=SLOT_SIGNATURE, classes=()):
        self.names = list(names)
        self.classes = [float(c) for c in classes]

    def matrix(self, get) -> np.ndarray:
        cols = []
        for name in self.names:
            v = get(name)
            if v is None:
                raise KeyError(f"the judge reads {name!r}, which the decoder does not give")
            v = np.asarray(v, dtype=np.float64)
            if name == "token_class":
                cols.extend((v == c).astype(np.float64) for c in self.classes)
            else:
                cols.append(v)
        return np.column_stack(cols)


SLOTS = Design()


def _judge_thresholds(F: dict, model: Judge, lam: float, greedy: bool,
                      design: Design) -> np.ndarray:
    accept = model.probability(design.matrix(F.get).T) < lam
    if greedy:                              # the standard rule's 0: nothing else is read
        return np.where(accept, 1.0, 0.0)
    return np.where(accept, 1.0, _standard(F["draft_prob"], F["target_prob"], False))


def rule(model: Judge, lam: float, greedy: bool, design: Design = SLOTS,
         name: str = "learned_judge"):
    """The judge at λ as a decoder rule (``evolve.rules.adapters.VectorRule``): it
    decides free-running as ``thresholds`` decides offline. ``design`` names what it
    reads (the slot inputs unless a judge was fit on another matrix, ``fit_xy``)."""
    return vector_rule(_judge_thresholds, f"{name}(lambda={lam:g})", model=model,
                       lam=lam, greedy=greedy, design=design)
