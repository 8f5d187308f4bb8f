"""Our token-population kernel against Operon's tree interpreter (pyoperon), per node,
on the same trees and the same rows.

    python -m benchmarks.speed.operon [--trees 1000] [--repeats 5] [--json FILE] [--smoke]

Data: the token train split (datasets/train.npz); Operon reads the same six input
columns (INPUT_NAMES order) as a float32 ``pyoperon.Dataset``.

Trees: two mixes of ``--trees`` trees by Operon's BalancedTreeCreator (fixed seed,
target lengths uniform in 2..60, ~31 nodes a tree, the same lengths in both mixes;
constants from Operon's normal initializer, kept; variable weights set to 1, so a
variable node is the input and Operon's node count equals ours). Leaves read the
five float inputs (top_token_match is a bool in our typed language).
  arith           add sub mul div min max abs square, constants, variables
  transcendental  the same plus log exp sqrt at five times the frequency (about
                  half of all nodes; the share is printed)
Operon stores a tree in postfix order, a node's first argument right before it
(``[a, b, -]`` is ``b - a``): read backwards it is our prefix list (``sub(b, a)``).
Converted trees must print and parse back to the same nodes.

Values are checked before timing: Operon (float32) against ``population_thresholds``
(float64). Ours are protected operators, Operon's plain ones (log/sqrt of a negative
is NaN, x/0 inf, exp overflows at ~88 where ours caps at exp(50)), and Operon's
min/max drop a NaN (fmin(NaN, x) = x), so a NaN deep in a tree can end finite and
different: comparing the rows where both values are finite is not enough (~96% of
arith and ~70% of transcendental trees agree that way; printed as "finite only").
A row is compared when both values are finite and every node stays in the common
domain of both operator sets (``common_domain``); it agrees when |operon - ours| <=
1e-3 * max(1, |ours|) (float32 keeps ~7 digits, cancellation costs a few). A tree
agrees when >= 99% of its compared rows do. Unless >= 95% of the trees with compared
rows agree and the round trip holds, the script refuses to time (exit 1, one line);
on the full run every tree agrees, while reading sub as div passes ~25%. ``--smoke``
judges nothing.

Timing, per mix, one thread and two (``numba.set_num_threads``; Operon's
``nthread``): ours is ``population_counts`` (evaluate and tally every tree over the
split: a generation's cost; plog/pexp/psqrt of the inputs are precomputed once per
split, before timing), Operon's ``EvaluateTrees`` of all trees over all rows into a
preallocated float32 (trees, rows) array. A warm-up, then ``--repeats`` rounds
alternating ours, Operon; medians. Node evaluations/s = nodes (leaves included) x
rows / seconds; "ours/Operon" is the ratio of those rates (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT  # noqa: E402

SKIP = "pyoperon not installed: Operon reference skipped (pip install pyoperon)"
SEED = 20240611
ARITH = ("Add", "Sub", "Mul", "Div", "Fmin", "Fmax", "Abs", "Square", "Constant", "Variable")
TRANS = ("Log", "Exp", "Sqrt")
MIXES = {"arith": (ARITH, 1), "transcendental": (ARITH + TRANS, 5)}   # symbols, log/exp/sqrt weight
# Operon's node names (its C++ names; pyoperon's NodeType.Fmin/Fmax labels are swapped:
# NodeType.Fmin makes a node named "fmax" that computes the maximum) -> our primitives.
OURS = {"+": "add", "-": "sub", "*": "mul", "/": "pdiv", "fmin": "pmin", "fmax": "pmax",
        "abs": "absf", "square": "square", "log": "plog", "exp": "pexp", "sqrt": "psqrt"}
TOL, ROW_SHARE, TREE_SHARE = 1e-3, 0.99, 0.95
CHUNK = 100          # trees per value-check batch (bounds memory)


class Disagreement(RuntimeError):
    pass


def load_split(rows: int | None = None):
    from evolve.data.tokens import from_columns, load_npz
    from evolve.kernels.tokens import TokenArrays
    ds = load_npz(ROOT / "datasets" / "train.npz")
    if rows is not None and rows < len(ds):
        ds = from_columns({f: a[:rows] for f, a in ds.columns().items()}, name=ds.name)
    return TokenArrays(ds)


class OperonData:
    """The (inputs, rows) matrix as a float32 Operon dataset. pyoperon's Dataset views
    the numpy array without copying it, so the array is kept here (a dataset over a
    freed temporary reads garbage)."""

    def __init__(self, X: np.ndarray):
        import pyoperon as op
        from evolve.lang.primitives import INPUT_NAMES
        self.values = np.asfortranarray(X.T, dtype=np.float32)
        self.ds = op.Dataset(self.values)
        self.rows = self.ds.Rows
        variables = sorted(self.ds.Variables, key=lambda v: v.Index)
        self.inputs = {v.Hash: INPUT_NAMES[v.Index] for v in variables}   # hash -> our input


def make_trees(mix: str, n: int, od: OperonData, seed: int = SEED) -> list:
    """``n`` Operon trees of a mix, variable weights 1, constants as Operon drew them."""
    import pyoperon as op
    from evolve.lang import primitives as P
    symbols, weight = MIXES[mix]
    problem = op.Problem(od.ds)
    problem.ConfigurePrimitiveSet(sum(int(op.NodeType[s]) for s in symbols))   # bit flags
    pset = problem.PrimitiveSet
    for s in TRANS if weight != 1 else ():
        pset.SetFrequency(op.Node(op.NodeType[s]), weight)
    hashes = [h for h, name in od.inputs.items() if P.INPUT_TYPE[name] is float]
    creator = op.BalancedTreeCreator(pset, hashes, 0.0)
    coeffs = op.NormalCoefficientInitializer()
    coeffs.ParameterizeDistribution(0.0, 1.0)
    rng, lengths = op.RandomGenerator(seed), random.Random(seed)
    trees = []
    for _ in range(n):
        tree = creator(rng, lengths.randint(2, 60), 1, 12)
        coeffs(rng, tree)
        nodes = tree.Nodes                       # copies: edit, then rebuild the tree
        for node in nodes:
            if node.IsVariable:
                node.Value = 1.0
        trees.append(op.Tree(nodes).UpdateNodes())
    return trees


def to_nodes(tree, inputs: dict) -> list:
    """An Operon tree as our prefix nodes: its postfix list read backwards (see top)."""
    from evolve.lang import primitives as P
    from evolve.lang.treeio import Node
    out = []
    for n in reversed(tree.Nodes):
        if n.IsVariable:
            if n.Value != 1.0:
                raise ValueError(f"variable with weight {n.Value}: expected 1")
            out.append(Node("input", inputs[n.HashValue]))
        elif n.IsConstant:
            out.append(Node("const", P.CONSTANT_NAME, float(n.Value)))
        else:
            out.append(Node("prim", OURS[n.Name]))
    return out


def operon_values(trees, od: OperonData, threads: int = 1, out=None) -> np.ndarray:
    """Operon's float32 values of every tree on every row, (trees, rows)."""
    import pyoperon as op
    if out is None:
        out = np.empty((len(trees), od.rows), dtype=np.float32)
    op.EvaluateTrees(trees, od.ds, op.Range(0, od.rows), out, threads)
    return out


def common_domain(nodes, X: np.ndarray) -> np.ndarray:
    """Rows where every node of a tree gets arguments on which our protected operator
    and Operon's plain one are the same formula (pdiv |b| > 1e-9, plog x > 1e-12,
    psqrt x >= 0, pexp x < 50) and every value stays inside float32's range; found
    with the numpy reference of our primitives."""
    from evolve.lang import primitives as P
    from heuristics import ops as O
    same = {"pdiv": lambda a, b: np.abs(b) > O.DIV_EPS, "plog": lambda a: a > O.LOG_EPS,
            "psqrt": lambda a: a >= 0.0, "pexp": lambda a: a < O.EXP_MAX}
    ok, stack = np.ones(X.shape[1], dtype=bool), []
    with np.errstate(all="ignore"):
        for n in reversed(nodes):
            if n.kind == "input":
                v = X[P.INPUT_INDEX[n.name]]
            elif n.kind == "const":
                v = np.full(X.shape[1], n.value)
            else:
                args = [stack.pop() for _ in range(n.arity)]
                if n.name in same:
                    ok &= same[n.name](*args)
                v = P.BY_NAME[n.name].numpy(*args)
            ok &= np.abs(v) < 1e38
            stack.append(v)
    return ok


def _per_tree(a, b, mask) -> np.ndarray:
    """(rows compared, rows that agree) per tree."""
    with np.errstate(all="ignore"):
        hit = mask & (np.abs(a - b) <= TOL * np.maximum(1.0, np.abs(b)))
    return np.stack([mask.sum(axis=1), hit.sum(axis=1)], axis=1)


def _summary(counts: np.ndarray) -> dict:
    n, hit = counts[:, 0], counts[:, 1]
    return {"trees_compared": int((n > 0).sum()), "rows_compared": int(n.sum()),
            "rows_agree_share": float(hit.sum() / max(1, n.sum())),
            "trees_agree": int(((n > 0) & (hit >= ROW_SHARE * n)).sum())}


def check_values(trees, node_lists, split, od: OperonData) -> dict:
    """Compare Operon's and our values row by row (criterion: see top)."""
    from evolve.kernels.tokens import population_thresholds
    from evolve.lang import treeio
    dom, fin = [], []
    for i in range(0, len(trees), CHUNK):
        a = operon_values(trees[i:i + CHUNK], od).astype(np.float64)
        b = population_thresholds(treeio.linearise(node_lists[i:i + CHUNK]), split)
        finite = np.isfinite(a) & np.isfinite(b)
        common = np.array([common_domain(t, split.X) for t in node_lists[i:i + CHUNK]])
        dom.append(_per_tree(a, b, finite & common))
        fin.append(_per_tree(a, b, finite))
    out = _summary(np.concatenate(dom))
    share = out["trees_agree"] / max(1, out["trees_compared"])
    roundtrip = all(treeio.parse(treeio.to_string(t)) == t for t in node_lists[:10])
    return {"trees": len(trees), **out, "rows_total": len(trees) * int(split.n),
            "trees_agree_share": share, "finite_only": _summary(np.concatenate(fin)),
            "roundtrip": roundtrip,
            "passed": bool(roundtrip and out["trees_compared"] and share >= TREE_SHARE)}


def time_pair(programs, split, trees, od: OperonData, threads: int, repeats: int) -> dict:
    """Median seconds of ours and Operon's, interleaved, after one warm-up each."""
    import numba
    from evolve.kernels.tokens import population_counts
    out = np.empty((len(trees), od.rows), dtype=np.float32)
    runs = {"ours": lambda: population_counts(programs, split),
            "operon": lambda: operon_values(trees, od, threads, out)}
    seconds = {k: [] for k in runs}
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        for r in range(repeats + 1):             # round 0 is the warm-up
            for k, fn in runs.items():
                t0 = time.perf_counter()
                fn()
                if r:
                    seconds[k].append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(before)
    return {"ours_s": statistics.median(seconds["ours"]),
            "operon_s": statistics.median(seconds["operon"]),
            "ours_all_s": seconds["ours"], "operon_all_s": seconds["operon"]}


def measure(trees: int = 1000, repeats: int = 5, rows: int | None = None,
            judge: bool = True) -> dict:
    """Check and time both mixes; with ``judge``, raise Disagreement before timing a
    mix whose values do not agree."""
    import os
    from importlib.metadata import version

    import numba
    from evolve.lang import treeio
    split = load_split(rows)
    od = OperonData(split.X)
    doc = {"rows": int(split.n), "trees": trees, "repeats": repeats, "seed": SEED,
           "criterion": {"rel_tol": TOL, "row_share": ROW_SHARE, "tree_share": TREE_SHARE},
           "cpus": os.cpu_count(), "numba_threads": numba.config.NUMBA_NUM_THREADS,
           "versions": {"pyoperon": version("pyoperon"), "numba": numba.__version__,
                        "numpy": np.__version__}, "mixes": {}}
    for mix in MIXES:
        otrees = make_trees(mix, trees, od)
        nodes = [to_nodes(t, od.inputs) for t in otrees]
        total = sum(map(len, nodes))
        assert total == sum(t.Length for t in otrees), "node counts differ from Operon's"
        trans = sum(n.name in ("plog", "pexp", "psqrt") for t in nodes for n in t)
        check = check_values(otrees, nodes, split, od)
        if judge and not check["passed"]:
            raise Disagreement(
                f"{mix}: {check['trees_agree']} of {check['trees_compared']} trees agree with "
                f"Operon on >= {ROW_SHARE:.0%} of their rows (need {TREE_SHARE:.0%}), round "
                f"trip {'ok' if check['roundtrip'] else 'FAILED'}: not timing")
        programs, evals = treeio.linearise(nodes), total * int(split.n)
        timing = {}
        for t in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            r = time_pair(programs, split, otrees, od, t, repeats)
            r["ours_node_evals_per_s"] = evals / r["ours_s"]
            r["operon_node_evals_per_s"] = evals / r["operon_s"]
            r["ours_over_operon"] = r["operon_s"] / r["ours_s"]       # ratio of the rates
            timing[str(t)] = r
        doc["mixes"][mix] = {"nodes": total, "mean_size": total / trees,
                             "transcendental_share": trans / total,
                             "example": treeio.to_string(nodes[0]),
                             "check": check, "threads": timing}
    return doc


def print_table(doc: dict) -> None:
    print(f"Operon {doc['versions']['pyoperon']} vs population kernel: {doc['rows']:,} rows, "
          f"{doc['trees']} trees per mix, median of {doc['repeats']}")
    print(f"{'mix':<15}{'nodes':>8}{'log/exp/sqrt':>14}{'rows compared':>15}{'agree':>10}"
          f"{'trees >=99%':>13}{'| finite only: agree':>21}{'trees >=99%':>13}")
    for mix, m in doc["mixes"].items():
        c, f = m["check"], m["check"]["finite_only"]
        print(f"{mix:<15}{m['nodes']:>8,}{m['transcendental_share']:>14.1%}"
              f"{c['rows_compared'] / c['rows_total']:>15.1%}{c['rows_agree_share']:>10.4%}"
              f"{c['trees_agree']:>7}/{c['trees_compared']:<5}{f['rows_agree_share']:>21.4%}"
              f"{f['trees_agree']:>7}/{f['trees_compared']:<5}")
    print(f"{'mix':<15}{'threads':>8}{'ours s':>9}{'Operon s':>10}"
          f"{'ours Gnode/s':>14}{'Operon Gnode/s':>16}{'ours/Operon':>13}")
    for mix, m in doc["mixes"].items():
        for t, r in m["threads"].items():
            print(f"{mix:<15}{t:>8}{r['ours_s']:>9.3f}{r['operon_s']:>10.3f}"
                  f"{r['ours_node_evals_per_s'] / 1e9:>14.2f}"
                  f"{r['operon_node_evals_per_s'] / 1e9:>16.2f}{r['ours_over_operon']:>13.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--smoke", action="store_true", help="20 trees, 1 repeat, 2,000 rows")
    args = ap.parse_args(argv)
    try:
        import pyoperon  # noqa: F401
    except ImportError:
        print(SKIP)
        doc = {"skipped": SKIP}
    else:
        try:
            if args.smoke:
                doc = {"mode": "smoke", **measure(20, 1, rows=2000, judge=False)}
            else:
                doc = {"mode": "full", **measure(args.trees, args.repeats)}
        except Disagreement as e:
            print(e, file=sys.stderr)
            return 1
        print_table(doc)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
