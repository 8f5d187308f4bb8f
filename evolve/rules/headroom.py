"""How much a better rule could still buy: per-position leniency and a knapsack oracle.

``position_leniency``: leniency with one parameter per block position,
``min(1, t / (l_j d))`` with ``l_j`` chosen by ``block_position`` (a tree of the
primitive language). ``tune_position_leniency`` maximises tokens per call on one
split subject to the mean TV per token: coordinate ascent over the ``l_j`` on
a grid for the Lagrangian ``tokens - lam * TV per call``, with ``lam`` bisected;
the best point within the budget among everything evaluated is kept. Every
candidate is evaluated exactly (``evolve.kernels.speculative``, or on a torch device
through ``evolve.rules.kernel``: the same sums).

``knapsack_oracle``: not a rule but a bound on what rules of this kind can buy
on a given split. Accepting every top-k candidate of the drafted row ``i``
costs its extra acceptance mass in TV and buys, per unit of that mass, the
token itself plus the tokens expected after it in the block under the standard
rule (``1 + V_{i+1}``, from the recorded trajectory); rows are taken greedily by
that ratio until the exact mean TV per token reaches the budget (the last one
partly). It knows each row's future in the recorded trajectory, which no rule
does, so it is an (approximate, greedy) upper reference, reported on the split
it is computed on.
"""

from __future__ import annotations

import numpy as np

from evolve.lang import treeio
from evolve.objectives import spec
from evolve.rules import kernel

GRID = tuple(np.round(np.linspace(0.30, 1.00, 36), 4))
SWEEPS = 3
BISECT = 18
LAMBDA_MAX = 64.0


def position_leniency_tree(ls) -> str:
    """``min(1, t / (l_j d))``, ``l_j`` by block position (the last one from there on)."""
    ls = [float(x) for x in ls]
    value = repr(ls[-1])
    for j in range(len(ls) - 2, -1, -1):
        value = f"ite(lt(block_position, {j + 0.5!r}), {ls[j]!r}, {value})"
    return f"pmin(1.0, pdiv(target_prob, mul({value}, draft_prob)))"


def _evaluate(trees: list[str], sa: spec.TraceArrays, device: str = "cpu") -> list:
    progs = treeio.linearise([treeio.parse(t) for t in trees])
    return kernel.results(progs, sa, False, device)


def tune_position_leniency(sa: spec.TraceArrays, budget: float, device: str = "cpu"):
    """``(ls, objectives)``: the best per-position leniency within ``budget`` on ``sa``
    (None if not even l = 1, the standard rule, fits); kernel sums on ``device``."""
    g = sa.g
    seen: dict[tuple, object] = {}

    def score(candidates):
        todo = [c for c in candidates if c not in seen]
        if todo:
            for c, o in zip(todo, _evaluate([position_leniency_tree(c) for c in todo], sa,
                                            device)):
                seen[c] = o
        return [seen[c] for c in candidates]

    def ascend(lam: float):
        ls = [1.0] * g
        for _ in range(SWEEPS):
            for j in range(g):
                cands = [tuple(ls[:j] + [v] + ls[j + 1:]) for v in GRID]
                objs = score(cands)
                vals = [o.tokens_per_call - lam * o.tv_per_token * o.tokens_per_call
                        for o in objs]
                ls = list(cands[int(np.argmax(vals))])
        return tuple(ls)

    lo, hi = 0.0, LAMBDA_MAX          # lam 0 spends TV freely; LAMBDA_MAX almost none
    for _ in range(BISECT):
        mid = 0.5 * (lo + hi)
        o = score([ascend(mid)])[0]
        if o.tv_per_token > budget:
            lo = mid
        else:
            hi = mid
    feasible = [(c, o) for c, o in seen.items() if o.tv_per_token <= budget]
    if not feasible:
        return None
    ls, o = max(feasible, key=lambda co: (co[1].tokens_per_call, -co[1].tv_per_token))
    return tuple(float(x) for x in ls), o


def continuation(sa: spec.TraceArrays) -> np.ndarray:
    """1 + V_{i+1} of every drafted row under the standard rule (see module docstring)."""
    std = spec.position_terms(sa, np.minimum(1.0, sa.cp / sa.cq))
    g, nb = sa.g, sa.n_blocks
    ax = std.a_x.reshape(nb, g)
    al = std.alpha.reshape(nb, g)
    V = np.zeros((nb, g))
    for j in range(g - 2, -1, -1):          # V[j] = expected tokens after slot j
        V[:, j] = al[:, j + 1] + ax[:, j + 1] * V[:, j + 1]
    return (1.0 + V).reshape(-1)


def knapsack_oracle(sa: spec.TraceArrays, budget: float) -> spec.Objectives:
    """The greedy knapsack bound at ``budget`` on ``sa`` (see module docstring)."""
    std = np.minimum(1.0, sa.cp / sa.cq).reshape(sa.n, sa.k)
    order = np.argsort(-continuation(sa), kind="stable")

    def objectives(x: float):
        m = int(np.floor(x))
        frac = x - m
        a = std.copy()
        a[order[:m]] = 1.0
        if m < sa.n and frac > 0:
            r = order[m]
            a[r] = std[r] + frac * (1.0 - std[r])
        return spec.objectives(sa, a.reshape(-1))

    lo, hi = 0.0, float(sa.n)
    if objectives(hi).tv_per_token <= budget:
        return objectives(hi)
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if objectives(mid).tv_per_token <= budget:
            lo = mid
        else:
            hi = mid
    return objectives(lo)
