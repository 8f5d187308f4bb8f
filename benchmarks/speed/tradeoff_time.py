"""Where ``evolve tradeoff`` spends its time: the kernel sums (which ``--device cuda``
moves to the torch kernel) against everything else (the numpy reference that reports
each tuned rule on valid and test, the knapsack oracle, parsing).

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.tradeoff_time [--data DIR] [--budget B ...] [--device cpu|cuda]
                                       [--repeats N] [--json FILE]

Runs ``evolve.rules.tuning.tradeoff`` on the valid and test splits of ``--data``
(default: datasets/traces) ``--repeats`` times (after one warm-up call that compiles
or loads the kernels) and reports, per call, the wall seconds, the seconds inside the
kernel sums (``evolve.rules.kernel.results``, every kernel evaluation of the report)
and the number of those calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402


def measure(data: Path, budgets, device: str, repeats: int) -> dict:
    from evolve.data import traces
    from evolve.objectives import spec
    from evolve.rules import kernel, tuning
    splits = traces.load_splits(data, ("valid", "test"))
    sas = {s: spec.TraceArrays.from_split(ts) for s, ts in splits.items()}
    real = kernel.results
    spent = []

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t)
    kernel.results = timed         # tuning and headroom call it through the module
    try:
        tuning.tradeoff(sas["valid"], sas["test"], budgets, device=device)     # warm-up
        rows = []
        for _ in range(repeats):
            spent.clear()
            t = time.perf_counter()
            tuning.tradeoff(sas["valid"], sas["test"], budgets, device=device)
            rows.append({"total_s": time.perf_counter() - t, "kernel_s": sum(spent),
                         "kernel_calls": len(spent)})
    finally:
        kernel.results = real
    med = {k: statistics.median(r[k] for r in rows) for k in ("total_s", "kernel_s")}
    return {"data": str(data), "device": device, "budgets": list(budgets),
            "blocks": {s: sa.n_blocks for s, sa in sas.items()},
            "block_size": sas["test"].g, "top_k": sas["test"].k, "repeats": rows,
            "median_total_s": med["total_s"], "median_kernel_s": med["kernel_s"],
            "kernel_share": med["kernel_s"] / med["total_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "datasets" / "traces")
    ap.add_argument("--budget", type=float, action="append", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    out = measure(a.data, a.budget or [0.01, 0.03], a.device, a.repeats)
    print(f"{out['data']} ({out['blocks']['valid']} valid, {out['blocks']['test']} test "
          f"blocks), device {out['device']}: median {out['median_total_s']:.2f} s per "
          f"tradeoff, {out['median_kernel_s']:.2f} s of it in "
          f"{out['repeats'][0]['kernel_calls']} kernel calls "
          f"({100 * out['kernel_share']:.0f}%)")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
