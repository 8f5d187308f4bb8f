"""Rule families tuned on task traces to a budget of accepted critical tokens.

Every family of the rules table that the task world tunes (``table.families("task")``)
is swept over its grid on valid with the exact task objectives
(``evolve.objectives.task_labels``), and the parameter with the most tokens per call
whose critical tokens per token are within the budget is kept (ties: fewer critical
tokens, then the earlier grid value); a lenient family's best grid value is then
refined by bisection towards its infeasible neighbour. It is reported on test.

The learned judge (``evolve.rules.judge``: a logistic regression of the labels on the
rule inputs, fit on train, as AutoJudge fits its classifier) is tuned the same way
over its threshold.
"""

from __future__ import annotations

import numpy as np

from evolve.lang import treeio
from evolve.objectives import task_labels as TL
from evolve.objectives.task_data import metrics_of
from evolve.rules import judge
from evolve.rules.table import RATIO, RULES, families

BISECT_STEPS = 20
JUDGE = "learned_judge"


STANDARD = "standard (lossless)"


def standard_thresholds(td) -> np.ndarray:
    """The lossless rule's thresholds of every drafted row of a task split: greedy, 0
    (a draft that is not the target's argmax is rejected; argmax drafts are kept
    whatever the threshold); sampling, the standard rule's min(1, t/d)."""
    if td.greedy:
        return np.zeros(td.n)
    from evolve.kernels.tokens import matrix_thresholds   # lazy: start-up (Numba)
    return matrix_thresholds(treeio.linearise([treeio.parse(RATIO)]), td.X)[0]


def _family_sums(name: str, td, params) -> np.ndarray:
    from evolve.kernels.tokens import matrix_thresholds   # lazy: start-up (Numba)
    progs = treeio.linearise([treeio.parse(RULES[name].task_tree(p, td.greedy))
                              for p in params])
    return td.thresholds_sums(matrix_thresholds(progs, td.X))


def _best(rows, budget):
    """The index of the row with the most tokens per call within the budget (ties:
    fewer critical tokens, then the earlier), and which rows fit; (None, ...) if none."""
    m = TL.measures(rows)
    ok = m["critical_per_answer"] <= budget
    fit = np.flatnonzero(ok)
    if fit.size == 0:
        return None, ok
    i = max(fit, key=lambda j: (m["tokens_per_call"][j], -m["critical_per_answer"][j], -j))
    return int(i), ok


def tune(name: str, td, budget: float):
    """(parameter, its valid sums row) with the most tokens per call within the budget,
    or None when no parameter fits."""
    r = RULES[name]
    grid = list(r.grid) if r.param is not None else [None]
    rows = _family_sums(name, td, grid)
    i, ok = _best(rows, budget)
    if i is None:
        return None
    best_p, best_row = grid[i], rows[i]
    if r.param is not None and r.lenient and i + 1 < len(grid) and not ok[i + 1]:
        lo, hi = grid[i], grid[i + 1]        # feasible .. infeasible
        for _ in range(BISECT_STEPS):
            mid = 0.5 * (lo + hi)
            row = _family_sums(name, td, [mid])[0]
            m = TL.measures(row)
            if m["critical_per_answer"][0] <= budget:
                lo = mid
                if m["tokens_per_call"][0] > TL.measures(best_row)["tokens_per_call"][0]:
                    best_p, best_row = mid, row
            else:
                hi = mid
    return (None if best_p is None else float(best_p)), best_row


def tuned_all(tds: dict, budget: float) -> dict:
    """Every task family (and the learned judge, fit on ``tds["train"]``) tuned on
    valid to ``budget``, reported on test: name -> {rule, param, budget, valid, test}
    (metrics of ``task_data.metrics_of``), or None when nothing fits."""
    out = {STANDARD: {"rule": STANDARD, "param": None, "budget": budget, **{
        k: metrics_of(tds[k].thresholds_sums(standard_thresholds(tds[k])))
        for k in ("valid", "test")}}}
    for name in families("task", "greedy" if tds["valid"].greedy else "sample"):
        t = tune(name, tds["valid"], budget)
        if t is None:
            out[name] = None
            continue
        p, row = t
        test = _family_sums(name, tds["test"], [p])[0]
        out[name] = {"rule": name, "param": p, "budget": budget,
                     "valid": metrics_of(row), "test": metrics_of(test)}
    model = judge.fit(tds["train"])
    t = judge.tune(model, tds["valid"], budget)
    out[JUDGE] = None if t is None else {
        "rule": JUDGE, "param": t[0], "budget": budget, "valid": metrics_of(t[1]),
        "test": metrics_of(tds["test"].thresholds_sums(judge.thresholds(model, tds["test"],
                                                                         t[0]))),
        "weights": model.to_dict()}
    return out
