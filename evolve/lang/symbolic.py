"""A tree as a sympy expression: the plain meaning of each primitive (the primitive
table's ``sympy`` column), a reading aid.

Protected operators read as their plain counterparts (``pdiv`` as ``/``, ``plog`` as
log|x|, ...), so the expression is the rule on ordinary inputs, not at the protected
edges; ``evolve inspect`` simplifies it, ``evolve.Rule.sympy`` returns it. With
``protected=True`` they stay named functions instead (``pdiv(t, d)``: sympy cannot
simplify them away), as ``evolve.Rule.latex`` writes them. Inputs are
symbols named by their short names (``t``, ``d``, ``bpos``, ...); ``position`` is a
non-negative integer and ``top_token_match`` a boolean symbol. sympy is imported only
when an expression is made.
"""

from __future__ import annotations

from evolve.lang import primitives as P


# The protected primitives: those whose exports call a helper of their own name
# (heuristics/ops.py: pdiv, plog, pexp), which differ from the plain operator at the edges.
PROTECTED = tuple(p.name for p in P.PRIMITIVES if p.exports["numpy"].startswith(p.name + "("))


def sympy_expr(nodes, protected: bool = False):
    """The sympy expression of parsed tree nodes (``evolve.lang.treeio.parse``); with
    ``protected``, each protected primitive is an undefined function of its name."""
    import sympy as S    # lazy: start-up (SymPy loads only where it is used)
    syms = {name: S.Symbol(short, real=True) for name, short in P.INPUT_SHORT.items()}
    syms["position"] = S.Symbol("pos", nonnegative=True, integer=True)
    syms["top_token_match"] = S.Symbol("match")
    out = []
    for n in reversed(nodes):
        if n.kind == "input":
            out.append(syms[n.name])
        elif n.kind == "const":
            out.append(S.Integer(int(n.value)) if n.value == int(n.value) else S.Float(n.value))
        else:
            args = [out.pop() for _ in range(n.arity)]
            if protected and n.name in PROTECTED:
                out.append(S.Function(n.name)(*args))
            else:
                out.append(P.SYMPY[n.name](S, *args))
    return out[0]
