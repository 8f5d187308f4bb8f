"""Rule families of the rules table as numpy functions ``fn(F, param=...)`` over feature
columns (the form ``spec.rule_thresholds`` takes), for tests."""

from evolve.lang import numpy_eval, treeio
from evolve.rules.table import RULES


def fn(name: str):
    r = RULES[name]

    def rule(F, **kw):
        value = kw.get(r.param) if r.param else None
        return numpy_eval.evaluate(treeio.parse(r.tree(value)), F)
    rule.__name__ = name
    return rule


standard = fn("standard_rejection")
leniency = fn("leniency")
ears = fn("ears")
typical = fn("typical_acceptance")
bild = fn("bild_rollback")
