"""Evolved trace champions vs every tuned baseline, on the neural pair's traces.

For each TV budget and seed, runs `evolve run --objective speed --budget-tv B`
(settings below) on the traces; then tunes every rule family of the rules
table to the budget on valid and reports, on test, tokens per call and TV per
token of each baseline and each champion, and each champion's paired margin
over each baseline in tokens per call with two standard errors: over blocks
(as `benchmarks/experiments/trace_margins.py`) and over sequences (blocks of one prompt
are correlated, so this one is the honest one). Prints markdown tables and
writes the numbers as JSON. Usage (after `make neural-pair neural-traces`):

    python -m benchmarks.experiments.neural_pair_results [--data datasets/neural-traces] [--seeds 1 2 3]
        [--population 800] [--generations 80]
"""

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

import numpy as np  # noqa: E402

import evolve  # noqa: E402
from evolve.data import traces  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.rules import tuning  # noqa: E402
from evolve.rules.table import families  # noqa: E402

BUDGETS = (0.01, 0.03)
RUN = {"objective": "speed", "population": 800, "generations": 80, "tournament": 3,
       "seed_baselines": True}


def block_tokens(sa: spec.TraceArrays, h) -> np.ndarray:
    return spec.block_sums(sa, spec.position_terms(sa, h))["tokens"]


def margin(sa, h_a, h_b, blocks_per_seq: int) -> dict:
    d = block_tokens(sa, h_a) - block_tokens(sa, h_b)
    per_seq = d.reshape(-1, blocks_per_seq).mean(axis=1)
    return {"diff": float(d.mean()), "se_blocks": float(d.std(ddof=1) / np.sqrt(d.size)),
            "se_sequences": float(per_seq.std(ddof=1) / np.sqrt(per_seq.size))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--data", type=Path, default=ROOT / "datasets" / "neural-traces")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--population", type=int, default=RUN["population"])
    ap.add_argument("--generations", type=int, default=RUN["generations"])
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "experiments" / "neural_pair_results.json")
    args = ap.parse_args(argv)
    run = {**RUN, "population": args.population, "generations": args.generations}
    va = spec.TraceArrays.from_split(traces.load(args.data / "valid.npz"))
    te_split = traces.load(args.data / "test.npz")
    te = spec.TraceArrays.from_split(te_split)
    bps = int(te_split.meta["config"]["blocks_per_prompt"])
    out = {"data": str(args.data), "run_settings": run, "budgets": {}}
    for b in BUDGETS:
        base = {}
        for fam in families():
            best = tuning.tune(fam, va, b)
            if best is None:
                base[fam] = None
                continue
            h = tuning.thresholds(fam, te, best.param)
            o = spec.objectives(te, h)
            base[fam] = {"param": best.param, "tokens": o.tokens_per_call,
                         "tv": o.tv_per_token, "h": h}
        champs = []
        for seed in args.seeds:
            t0 = time.perf_counter()
            name = f"neural-speed-tv{b:g}-s{seed}"
            r = evolve.run(data_dir=args.data, runs_dir=args.runs_dir, name=name, seed=seed,
                           tv_budget=b, writeback=False, force=True, **run)
            h = tuning.tree_thresholds(treeio.parse(r.champion["tree"]), te)
            o = spec.objectives(te, h)
            champs.append({"seed": seed, "run": name, "expression": r.champion["expression"],
                           "tokens": o.tokens_per_call, "tv": o.tv_per_token,
                           "seconds": round(time.perf_counter() - t0, 1),
                           "vs": {f: margin(te, h, v["h"], bps)
                                  for f, v in base.items() if v is not None}})
        out["budgets"][str(b)] = {
            "baselines": {f: (None if v is None else {k: x for k, x in v.items() if k != "h"})
                          for f, v in base.items()}, "champions": champs}
        print(table(b, out["budgets"][str(b)]))
    args.json.write_text(json.dumps(out, indent=2))
    return 0


def table(budget: float, res: dict) -> str:
    lines = [f"\n**TV budget {budget:g}** (test split; baselines tuned on valid)\n",
             "| rule | parameter | tokens/call | TV/token |", "|---|---|---|---|"]
    for f, v in res["baselines"].items():
        if v is None:
            lines.append(f"| {f} | (none within budget) | | |")
        else:
            p = "" if v["param"] is None else f"{v['param']:.4g}"
            lines.append(f"| {f} | {p} | {v['tokens']:.4f} | {v['tv']:.4f} |")
    for c in res["champions"]:
        lines.append(f"| champion seed {c['seed']} | `{c['expression']}` | {c['tokens']:.4f} "
                     f"| {c['tv']:.4f} |")
    fams = [f for f, v in res["baselines"].items() if v is not None]
    lines += ["", "| champion minus | " + " | ".join(fams) + " |",
              "|---|" + "---|" * len(fams)]
    for c in res["champions"]:
        cells = [f"{c['vs'][f]['diff']:+.4f} ± {c['vs'][f]['se_sequences']:.4f}" for f in fams]
        lines.append(f"| seed {c['seed']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
