"""Margins of trace champions over the baselines tuned to the same budget.

For each run directory named, reads the champion (tree text, parsed, never
evaluated) and its TV budget, tunes leniency and EARS to that budget on the
valid traces, and prints test tokens per call and TV per token of each, with
the champion's paired difference and its standard error over the same test
blocks. Needs the default traces (`evolve data trace`). Usage:

    python -m benchmarks.experiments.trace_margins RUN [RUN ...]
"""

import argparse
import json
import sys

import numpy as np  # noqa: E402

from evolve.data import traces  # noqa: E402
from evolve.kernels.tokens import matrix_thresholds  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.rules import tuning  # noqa: E402
from evolve.io import paths  # noqa: E402
from evolve.runs.rundir import RunDir  # noqa: E402

FAMILIES = ("leniency", "ears")


def champion_thresholds(tree: str, sa: spec.TraceArrays) -> np.ndarray:
    """The kernel's thresholds of a tree on every candidate row of a trace split."""
    return matrix_thresholds(treeio.linearise([treeio.parse(tree)]), sa.X)[0]


def margins(tree: str, budget: float, va: spec.TraceArrays, te: spec.TraceArrays) -> list[dict]:
    """The champion on test, then each family tuned to ``budget`` on valid, on test."""
    h = champion_thresholds(tree, te)
    o = spec.objectives(te, h)
    out = [{"budget": budget, "test_tokens_per_call": o.tokens_per_call,
            "test_tv_per_token": o.tv_per_token}]
    for family in FAMILIES:
        best = tuning.tune(family, va, budget)
        if best is None:
            out.append({"vs": family, "param": None, "note": "no parameter within the budget"})
            continue
        hb = tuning.thresholds(family, te, best.param)
        ob = spec.objectives(te, hb)
        d, se = spec.paired_tokens_difference(te, h, hb)
        out.append({"vs": family, "param": best.param,
                    "test_tokens_per_call": ob.tokens_per_call,
                    "test_tv_per_token": ob.tv_per_token,
                    "champion_minus_baseline": d, "paired_se": se})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", metavar="RUN", help="run directories under runs/")
    names = ap.parse_args(argv).runs
    va = spec.TraceArrays.from_split(traces.load(paths.TRACES_DIR / "valid.npz"))
    te = spec.TraceArrays.from_split(traces.load(paths.TRACES_DIR / "test.npz"))
    parent = paths.runs_dir()
    for name in names:
        champ = RunDir.open(parent, name).champion()
        rows = margins(champ["tree"], champ["tv_budget"], va, te)
        print(json.dumps({"run": name, **rows[0]}))
        for row in rows[1:]:
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
