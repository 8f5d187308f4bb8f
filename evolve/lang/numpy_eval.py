"""The numpy evaluator of trees: each primitive's numpy meaning, node by node.

``evaluate(nodes, columns)`` evaluates parsed nodes (``treeio.parse``)
bottom-up over feature columns (a mapping from input name to array; any shape,
broadcast together). Nothing is compiled or evaluated as text. It is the
evaluator of rule sweeps on traces, of rules in simulated decoding, and of the
numpy export; the kernels are tested against it.
"""

from __future__ import annotations

import numpy as np

from evolve.lang import primitives as P


def evaluate(nodes, columns) -> np.ndarray:
    """Thresholds of a tree over feature columns, float64, broadcast to their shape."""
    stack: list = []
    with np.errstate(all="ignore"):
        for node in reversed(nodes):
            if node.kind == "prim":
                prim = P.BY_NAME[node.name]
                args = [stack.pop() for _ in range(prim.arity)]
                stack.append(prim.numpy(*args))
            elif node.kind == "input":
                stack.append(columns[node.name])
            else:
                stack.append(np.float64(node.value))
    out = np.asarray(stack[0], dtype=np.float64)
    shapes = [np.shape(columns[n.name]) for n in nodes if n.kind == "input"]
    shape = np.broadcast_shapes(*shapes) if shapes else out.shape
    return np.broadcast_to(out, shape).copy() if out.shape != shape else out
