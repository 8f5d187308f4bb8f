"""How much can moving distortion to the start of the draft block buy?

Leniency l_j = 1 - a * shape_j per block position j (accept with
min(1, t / (l_j d))), with a bisected so that the mean TV per token equals the
budget on the valid trace split; prints tokens per call for several shapes
against uniform leniency tuned to the same budget. Needs the default traces
(`evolve data trace`). Usage:

    python -m benchmarks.experiments.position_leniency [--budgets 0.01 0.03]
"""

import argparse
import sys
from pathlib import Path


import numpy as np  # noqa: E402

from evolve.data import traces  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.rules import tuning  # noqa: E402
from evolve.io import paths  # noqa: E402

# shape_j per block position: 1 where leniency applies fully, 0 where the rule is standard
SHAPES = ([1, 0, 0, 0], [0, 0, 0, 1], [1, 1, 0, 0], [1, .5, .25, 0], [0, .25, .5, 1],
          [1, 1, 1, 1], [1, 1, 1, 0], [0, 1, 1, 1])
BISECT_STEPS = 25
MAX_AMOUNT = 0.99        # l_j stays above 0


def objectives(sa: spec.TraceArrays, leniencies) -> spec.Objectives:
    """Objectives of min(1, t / (l_j d)) with l_j by block position."""
    pos = sa.features()["block_position"].astype(int)
    L = np.asarray(leniencies, dtype=np.float64)[pos]

    def rule(F):
        return np.minimum(1.0, F["target_prob"] / (L * F["draft_prob"]))
    return spec.objectives(sa, spec.rule_thresholds(rule, sa))


def leniencies(shape, amount: float) -> list[float]:
    return [1.0 - amount * s * MAX_AMOUNT for s in shape]


def largest_amount(sa: spec.TraceArrays, shape, budget: float) -> float:
    """The largest a in [0, 1] with TV per token within the budget (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(BISECT_STEPS):
        a = 0.5 * (lo + hi)
        if objectives(sa, leniencies(shape, a)).tv_per_token <= budget:
            lo = a
        else:
            hi = a
    return lo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.03],
                    help="mean TV per token allowed")
    ap.add_argument("--traces", type=Path, default=paths.TRACES_DIR,
                    help="directory with the trace splits (valid.npz is read)")
    args = ap.parse_args(argv)
    sa = spec.TraceArrays.from_split(traces.load(args.traces / "valid.npz"))
    if sa.g != len(SHAPES[0]):
        ap.error(f"the shapes are for blocks of {len(SHAPES[0])}; these traces have {sa.g}")
    for budget in args.budgets:
        t = tuning.tune("leniency", sa, budget)
        if t is None:
            print(f"budget {budget}: no uniform leniency within the budget")
        else:
            print(f"budget {budget}: uniform leniency l={t.param:.4f} tokens {t.tokens:.4f} "
                  f"tv {t.tv:.5f}")
        for shape in SHAPES:
            a = largest_amount(sa, shape, budget)
            o = objectives(sa, leniencies(shape, a))
            print(f"  shape {shape}: a={a:.3f} tokens {o.tokens_per_call:.4f} "
                  f"tv {o.tv_per_token:.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
