"""Margins of trace champions over the baselines tuned to the same budget.

For each run directory named, reads the champion (tree text, parsed, never
evaluated) and its TV budget, tunes leniency and EARS to that budget on the
valid traces, and prints test tokens per call and TV per token of each, with
the champion's paired difference and its standard error over the same test
blocks. Needs the default traces (`evolve data trace`). Usage:

    python benchmarks/trace_margins.py RUN [RUN ...]
"""

import json
import sys
from types import SimpleNamespace

from evolve import pareto, runs, spec, traces, treeio
from evolve.kernels import population_thresholds


def champion_thresholds(tree: str, sa) -> "np.ndarray":   # noqa: F821
    """The kernel's thresholds of a tree on every candidate row of a trace split."""
    split = SimpleNamespace(X=sa.X, n=sa.X.shape[1])
    return population_thresholds(treeio.linearise([treeio.parse(tree)]), split)[0]


def main(names):
    va = spec.SpecArrays.from_split(traces.load(traces.DEFAULT_DIR / "valid.npz"))
    te = spec.SpecArrays.from_split(traces.load(traces.DEFAULT_DIR / "test.npz"))
    parent = runs.runs_dir(None)
    for name in names:
        champ = runs.RunDir.open(parent, name).champion()
        budget = champ["tv_budget"]
        h = champion_thresholds(champ["tree"], te)
        o = spec.objectives(te, h)
        print(json.dumps({"run": name, "budget": budget, "test_tokens_per_call": o.tokens_per_call,
                          "test_tv_per_token": o.tv_per_token}))
        for family in ("leniency", "ears"):
            best = pareto.tune(family, va, budget)
            r = pareto.RULES[family]
            hb = spec.rule_thresholds(r.fn, te, **{r.param: best.param})
            ob = spec.objectives(te, hb)
            d, se = spec.paired_tokens_difference(te, h, hb)
            print(json.dumps({"vs": family, "param": best.param,
                              "test_tokens_per_call": ob.tokens_per_call,
                              "test_tv_per_token": ob.tv_per_token,
                              "champion_minus_baseline": d, "paired_se": se}))


if __name__ == "__main__":
    main(sys.argv[1:])
