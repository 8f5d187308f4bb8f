"""A learned value gate: spend the distortion where keeping the draft is worth most.

Past the standard rule each unit of acceptance costs at least one unit of TV (the
bound at the top of docs/results.md), so a rule can only choose where to spend. What
keeping the draft at a slot buys is the token itself plus the tokens expected after
it in the block, ``1 + V`` (``evolve.rules.headroom.continuation``, the knapsack
oracle's ratio). The gate learns that value from the slot's inputs and spends where
the predicted value is high:

- **The value model**: gradient boosting of ``ROUNDS`` regression trees of depth
  ``DEPTH`` (least squares, learning rate ``RATE``, splits at ``BINS`` quantiles of
  each input, at least ``MIN_LEAF`` rows a leaf), fit on one split's drafted rows to
  ``continuation``. Its inputs are the slot's own (``ROW_INPUTS``: the same for every
  candidate of the slot), and with ``lookahead`` also ``next_tv`` and ``ahead``, what
  verification knows of the block's later slots (``evolve.lang.features``). Small
  and deterministic: numpy, histograms of the binned inputs, no library needed.
- **The gate**: where the predicted value is at least λ, the candidate's acceptance
  is raised from the standard ``min(1, t / d)`` to 1, or with a spend cap ``c`` to
  ``s + w (1 - s)`` with ``w = min(1, c / slot_tv)``, which adds at most ``c`` of TV
  at the slot (exactly ``w`` times the slot's TV over the full vocabulary: the
  emitted distribution moves linearly from p towards q). Elsewhere the standard rule.
- **Tuning**: λ is bisected over the split's predicted values to the largest
  acceptance within a TV budget, scored by the exact kernel sums
  (``evolve.rules.kernel``).

The gate's form is ``evolve.rules.table.gate_tree`` (``--seed-baselines`` with
``--lookahead`` seeds the search with it on ``ahead``). The model and the gate are one
tree of the primitive language (nested ``ite`` of ``lt`` comparisons, summed), so the
gate is scored, compared free-running and exported exactly as any rule is. It reads slot features, so it needs traces that have
them; with ``lookahead`` its offline numbers are an estimate, as for every rule that
reads ``next_tv`` or ``ahead``, and the free-running comparison measures it.
"""

from __future__ import annotations

import numpy as np

from evolve.lang import numpy_eval, treeio
from evolve.lang.features import LOOKAHEAD_INPUT_NAMES
from evolve.objectives import spec
from evolve.rules import headroom, kernel
from evolve.rules.table import gate_tree

ROW_INPUTS = ("block_position", "position", "draft_entropy", "target_entropy", "p_max",
              "q_max", "slot_tv", "slot_kl_pq", "slot_kl_qp")
ROUNDS = 20
DEPTH = 3
RATE = 0.3
BINS = 32
MIN_LEAF = 50


def inputs(lookahead: bool) -> tuple:
    """The value model's inputs, with or without the lookahead ones."""
    return ROW_INPUTS + (LOOKAHEAD_INPUT_NAMES if lookahead else ())


def _rows(sa: spec.TraceArrays, names) -> np.ndarray:
    """The drafted rows' inputs ``names`` (n, len(names)): the first candidate's (equal
    for every candidate of a slot)."""
    F = sa.features()
    return np.stack([np.asarray(F[f], dtype=np.float64).reshape(sa.n, sa.k)[:, 0]
                     for f in names], axis=1)


def binned(X: np.ndarray) -> tuple[np.ndarray, list]:
    """``(B, cuts)``: each input's candidate cuts (its ``BINS`` quantiles above its
    least value, so that each splits) and every row's bin under them (x < cuts[t]
    exactly when the bin is at most t)."""
    qs = np.linspace(0.0, 1.0, BINS + 1)[1:-1]
    cuts = [np.unique(np.quantile(X[:, j], qs)) for j in range(X.shape[1])]
    cuts = [c[c > X[:, j].min()] for j, c in enumerate(cuts)]
    B = np.stack([np.searchsorted(c, X[:, j], side="right") for j, c in enumerate(cuts)],
                 axis=1)
    return B, cuts


def _grow(B: np.ndarray, cuts: list, r: np.ndarray, idx: np.ndarray, depth: int):
    """A least-squares regression tree of the residuals ``r`` on the rows ``idx``:
    a leaf value, or ``(input, cut, left, right)`` (left: input < cut)."""
    n = len(idx)
    if depth == 0 or n < 2 * MIN_LEAF:
        return float(r[idx].mean())
    total = r[idx].sum()
    best = None
    for j, cj in enumerate(cuts):
        if not len(cj):
            continue
        b = B[idx, j]
        cnt = np.cumsum(np.bincount(b, minlength=len(cj) + 1))[:-1]
        sm = np.cumsum(np.bincount(b, weights=r[idx], minlength=len(cj) + 1))[:-1]
        ok = (cnt >= MIN_LEAF) & (n - cnt >= MIN_LEAF)
        if not ok.any():
            continue
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(ok, sm * sm / cnt + (total - sm) ** 2 / (n - cnt), -np.inf)
        t = int(np.argmax(gain))
        if best is None or gain[t] > best[0]:
            best = (gain[t], j, t)
    if best is None:
        return float(r[idx].mean())
    _, j, t = best
    left = B[idx, j] <= t
    return (j, float(cuts[j][t]), _grow(B, cuts, r, idx[left], depth - 1),
            _grow(B, cuts, r, idx[~left], depth - 1))


def _predict(node, X: np.ndarray) -> np.ndarray:
    if not isinstance(node, tuple):
        return np.full(len(X), node)
    j, c, left, right = node
    m = X[:, j] < c
    out = np.empty(len(X))
    out[m] = _predict(left, X[m])
    out[~m] = _predict(right, X[~m])
    return out


def _text(node, names, scale: float) -> str:
    if not isinstance(node, tuple):
        return repr(float(scale * node))
    j, c, left, right = node
    return (f"ite(lt({names[j]}, {c!r}), {_text(left, names, scale)}, "
            f"{_text(right, names, scale)})")


def _sum(terms: list) -> str:
    """The terms added as a balanced tree (shallow enough for any number of rounds)."""
    while len(terms) > 1:
        terms = [f"add({terms[i]}, {terms[i + 1]})" if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def fit(sa: spec.TraceArrays, lookahead: bool = False) -> str:
    """The value model fit on ``sa``'s drafted rows, as the text of a tree."""
    if sa.missing:
        raise ValueError(f"the value gate reads slot features: {sa.missing}")
    names = inputs(lookahead)
    X = _rows(sa, names)
    y = headroom.continuation(sa)
    B, cuts = binned(X)
    base = float(y.mean())
    f = np.full(len(y), base)
    terms = [repr(base)]
    for _ in range(ROUNDS):
        tree = _grow(B, cuts, y - f, np.arange(len(y)), DEPTH)
        f = f + RATE * _predict(tree, X)
        terms.append(_text(tree, names, RATE))
    return _sum(terms)


def predictions(value: str, sa: spec.TraceArrays) -> np.ndarray:
    """The value model's prediction on every drafted row of ``sa`` (n,)."""
    F = sa.features()
    v = numpy_eval.evaluate(treeio.parse(value), F)     # a scalar if it reads no input
    v = np.asarray(v, dtype=np.float64)
    if v.size == 1:
        return np.full(sa.n, float(v.reshape(-1)[0]))
    return v.reshape(sa.n, sa.k)[:, 0]


def tune(value: str, sa: spec.TraceArrays, budget: float, cap: float | None = None,
         device: str = "cpu"):
    """``(λ, objectives)``: the gate with the most tokens per call whose TV per token is
    within ``budget`` on ``sa`` (λ bisected between the split's predicted values; a
    higher λ spends less); None if not even the standard rule fits."""
    v = np.unique(predictions(value, sa))
    lams = np.concatenate([[v[0] - 1.0], 0.5 * (v[:-1] + v[1:]), [v[-1] + 1.0]])

    def score(i: int):
        tree = treeio.linearise([treeio.parse(gate_tree(value, lams[i], cap))])
        return kernel.results(tree, sa, True, device)[0]

    hi = len(lams) - 1                 # accepts no more than the standard rule
    top = score(hi)
    if top.tv_per_token > budget:
        return None
    best = (float(lams[hi]), top)
    low = score(0)
    if low.tv_per_token <= budget:
        return float(lams[0]), low
    lo = 0                             # infeasible .. feasible
    while hi - lo > 1:
        mid = (lo + hi) // 2
        o = score(mid)
        if o.tv_per_token <= budget:
            hi = mid
            if o.tokens_per_call >= best[1].tokens_per_call:
                best = (float(lams[mid]), o)
        else:
            lo = mid
    return best
