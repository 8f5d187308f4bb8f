"""How much can moving distortion to the start of the draft block buy?

Leniency l_j = 1 - a * shape_j per block position j (min(1, t / (l_j d))), with
a bisected so that the mean TV per token equals the budget on the valid trace
split; prints tokens per call for several shapes against uniform leniency.
Needs the default traces (`evolve data trace`). Usage:

    python benchmarks/position_leniency.py
"""
import numpy as np
from evolve import traces, spec, pareto
ts = traces.load("datasets/traces/valid.npz")
sa = spec.SpecArrays.from_split(ts)
F = sa.features()
def rule(ls):
    L = np.asarray(ls)[F["block_position"].astype(int)]
    return lambda F: np.minimum(1.0, F["target_prob"] / (L * F["draft_prob"]))
def obj(ls):
    h = spec.rule_thresholds(rule(ls), sa)
    return spec.objectives(sa, h)
for B in (0.01, 0.03):
    t = pareto.tune("leniency", sa, B)
    print("B", B, "uniform leniency", t.param, t.tokens, t.tv)
    best = None
    # search over l0 with others = 1 (lenient only at block start) and other profiles via bisection on a scale
    for shape in ([1,0,0,0],[0,0,0,1],[1,1,0,0],[1,.5,.25,0],[0,.25,.5,1],[1,1,1,1],[1,1,1,0],[0,1,1,1]):
        lo, hi = 0.0, 1.0  # amount a: l_j = 1 - a*shape_j ; find max a with tv<=B
        for _ in range(25):
            a = (lo+hi)/2
            o = obj([1 - a*s*0.99 for s in shape])
            if o.tv_per_token <= B: lo = a
            else: hi = a
        o = obj([1 - lo*s*0.99 for s in shape])
        print("  shape", shape, "a=%.3f tokens %.4f tv %.5f" % (lo, o.tokens_per_call, o.tv_per_token))
