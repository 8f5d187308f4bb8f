"""Slow, obvious reference implementations to test the fast paths against.

- ``eval_rows``: evaluates a tree row by row in plain Python with the scalar
  meaning of each primitive (heuristics/ops.py).
- ``eval_numpy``: evaluates a tree with the numpy meaning of each primitive,
  node by node (the way a DEAP user evaluates trees over arrays).
- ``metrics_naive``: the seed and expected metrics, counted token by token.
"""

from __future__ import annotations

import numpy as np

from evolve.lang import primitives as P
from evolve.kernels.layout import EXPECTED_SCALE


def _row_inputs(ds, j):
    return {
        "draft_prob": float(ds.draft_prob[j]),
        "target_prob": float(ds.target_prob[j]),
        "position": int(ds.position[j]),
        "draft_entropy": float(ds.draft_entropy[j]),
        "target_entropy": float(ds.target_entropy[j]),
        "top_token_match": bool(ds.top_token_match[j]),
    }


def _eval(nodes, leaf, prim):
    stack = []
    for node in reversed(nodes):
        if node.kind == "prim":
            args = [stack.pop() for _ in range(node.arity)]
            stack.append(prim(node, args))
        else:
            stack.append(leaf(node))
    assert len(stack) == 1
    return stack[0]


def eval_rows(nodes, ds) -> np.ndarray:
    out = np.empty(len(ds))
    for j in range(len(ds)):
        inputs = _row_inputs(ds, j)
        out[j] = float(_eval(nodes,
                             lambda n: n.value if n.kind == "const" else inputs[n.name],
                             lambda n, a: P.BY_NAME[n.name].scalar(*a)))
    return out


def eval_numpy(nodes, ds) -> np.ndarray:
    cols = {name: getattr(ds, name) for name in P.INPUT_NAMES}
    res = _eval(nodes, lambda n: n.value if n.kind == "const" else cols[n.name],
                lambda n, a: P.BY_NAME[n.name].numpy(*a))
    return np.broadcast_to(np.asarray(res, dtype=np.float64), (len(ds),)).copy()


def metrics_naive(h, ds) -> dict:
    """Counts by a plain loop over tokens, as the reference defines them."""
    n = len(ds)
    acc = fa = fr = 0
    e_acc = e_fa = e_fr = 0
    for j in range(n):
        x = float(h[j])
        a = bool(ds.rand_value[j] < x)
        b = bool(ds.baseline_accepts[j])
        acc += a
        fa += a and not b
        fr += b and not a
        p = 0.0 if not (x > 0) else min(x, 1.0)
        s = min(1.0, ds.target_prob[j] / ds.draft_prob[j])
        qp = int(p * EXPECTED_SCALE)
        qs = int(s * EXPECTED_SCALE)
        e_acc += qp
        e_fa += max(0, qp - qs)
        e_fr += max(0, qs - qp)
    quality = max(0.0, 1 - (10 * fa / n + 0.1 * fr / n))
    fitness = acc / n * quality if quality >= 0.95 else 0.5 * quality
    ea, efa, efr = (x / EXPECTED_SCALE for x in (e_acc, e_fa, e_fr))
    equality = max(0.0, 1 - (10 * efa / n + 0.1 * efr / n))
    efit = ea / n * equality if equality >= 0.95 else 0.5 * equality
    return {"accepted": acc, "false_accepts": fa, "false_rejects": fr,
            "accept_rate": acc / n, "accuracy": (n - fa - fr) / n, "quality": quality,
            "fitness": fitness, "expected_accept_rate": ea / n, "expected_fitness": efit}
