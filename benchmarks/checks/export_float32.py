"""float32 against float64: accept decisions of the numpy and torch exports.

    python -m benchmarks.checks.export_float32 [--data DIR]

For every installed baseline, the exported numpy and torch rules are evaluated in
float32 on the test split (default: datasets/) and their decisions u < threshold
compared with the Numba champion's (float64). Prints one line per rule: rows,
decisions that differ in float32 (numpy, torch), the largest threshold difference.
The float64 exports decide exactly as Numba (tests/test_export.py).
"""

from __future__ import annotations

import argparse
import types
from pathlib import Path

import numpy as np


def main() -> None:
    import torch

    from evolve.data import tokens as data
    from evolve.export.modules import export_source
    from evolve.lang import treeio
    from evolve.rules.table import RULES
    from evolve.io.paths import DATA_DIR
    from heuristics import registry
    from heuristics.baselines import BASELINES

    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA_DIR)
    args = ap.parse_args()
    ds = data.load_splits(args.data)["test"]
    cols = ds.features()
    u = ds.rand_value
    print(f"{'rule':22s} {'rows':>8s} {'numpy32':>8s} {'torch32':>8s} {'max |dh|':>10s}")
    for name in BASELINES:
        nodes = treeio.parse(RULES[name].tree(RULES[name].default))
        want = u < registry.compiled(name)(*cols)
        h64 = registry.compiled(name)(*cols)
        flips, dh = [], 0.0
        for fmt in ("numpy", "torch"):
            mod = types.ModuleType(fmt)
            exec(compile(export_source(nodes, fmt, {"metrics": {}}, name), fmt, "exec"),
                 mod.__dict__)
            c32 = [c if c.dtype == np.bool_ else c.astype(np.float32) for c in cols]
            if fmt == "torch":
                h = mod.threshold(*[torch.from_numpy(np.ascontiguousarray(c)) for c in c32])
                h = h.numpy()
            else:
                h = mod.threshold(*c32)
            got = u.astype(np.float32) < h
            flips.append(int((got != want).sum()))
            with np.errstate(invalid="ignore"):
                d = np.abs(h.astype(np.float64) - h64)
            dh = max(dh, float(np.nanmax(d)) if np.isfinite(d).any() else 0.0)
        print(f"{name:22s} {len(u):8d} {flips[0]:8d} {flips[1]:8d} {dh:10.3g}")


if __name__ == "__main__":
    main()
