"""How far the symbolic search stands from a learned policy on the same inputs: the
value gates against per-position leniency, offline and free-running: `make
results-value-gate`.

For each TV budget (0.01 and 0.03 per token, or --budgets) on the default n-gram traces (or any
traces with slot features, --data):

1. tune leniency with one parameter per block position on valid (the reference);
2. fit the two value gates' models on valid (``evolve.rules.value_gate``: gradient
   boosting of the slot's downstream value, ``1 + V``, on the slot's own inputs, and
   also on the lookahead inputs ``next_tv`` and ``ahead``), and tune λ on valid to the
   budget, each slot's spend capped at the reference's 99th percentile of slot TV on
   valid (the gate's tail no heavier than the reference's);
3. report all three on test offline (exact, except for the gate that reads ``ahead``:
   an estimate), and
4. decode all three free-running on the test prompts, paired (the same prompts and
   uniforms), once per seed of the uniforms: each gate's difference from the
   reference in tokens per call and TV per token with its 95% interval, and the
   spread over seeds.

Writes benchmarks/experiments/value_gate.json (or --out) and, with --page, the tables
between the value-gate markers of docs/results/lookahead.md (or those of --section).
Usage:

    python -m benchmarks.experiments.value_gate [--prompts 8192] [--seeds 1 2 3] [--page]
    python -m benchmarks.experiments.value_gate --quick     # tiny sizes, a smoke test
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.experiments import trace_results as TR  # noqa: E402
from evolve.freerun import paired  # noqa: E402
from evolve.io import paths  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.rules import headroom, tuning, value_gate  # noqa: E402
from evolve.rules.adapters import TreeRule  # noqa: E402

BUDGETS = (0.01, 0.03)
OUT = ROOT / "benchmarks" / "experiments" / "value_gate.json"
SECTION = "value-gate-results"
REFERENCE = "per-position leniency (tuned)"
LABELS = {"value_gate": "value gate", "value_gate_ahead": "value gate reading ahead"}


def _offline(tree: str, sa) -> dict:
    o = spec.objectives(sa, tuning.tree_thresholds(treeio.parse(tree), sa)).to_dict()
    return {k: o[k] for k in ("tokens_per_call", "tokens_se", "tv_per_token", "tv_p99",
                              "kl_per_token")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=paths.TRACES_DIR)
    ap.add_argument("--prompts", type=int, default=8192)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--page", action="store_true",
                    help="rewrite the tables between the section's markers (the value-gate "
                         "tables of docs/results/lookahead.md)")
    ap.add_argument("--section", default=SECTION,
                    help=f"the results page's markers the tables go between [{SECTION}]")
    ap.add_argument("--lookahead-slots", type=int, default=None,
                    help="reached slots at which the free-running TV of a rule that reads "
                         "a lookahead input is estimated (default: the pair's, 2,000 on the "
                         "n-gram pair, 300 on a Hugging Face pair; --quick: %d)" % TR.QUICK_LOOKAHEAD_SLOTS)
    TR.quick_and_render_args(ap)
    a = ap.parse_args(argv)
    if TR.rendered(a, markdown, lambda doc: TR.write_page(doc, a.section, markdown)):
        return 0
    if a.quick:
        a.prompts, a.blocks = 8, 2
        a.lookahead_slots = TR.QUICK_LOOKAHEAD_SLOTS
    t0 = time.perf_counter()
    splits = TR._traces(a.data, a.quick)
    sas = {s: spec.TraceArrays.from_split(splits[s]) for s in ("valid", "test")}
    if sas["valid"].missing:
        raise SystemExit(f"{a.data}: the value gates read slot features: "
                         f"{sas['valid'].missing}")
    pair = TR._pair(splits["test"], a.data)
    slots, futures = TR.source_of_pair(pair).lookahead  # recorded as used, not as None
    a.lookahead_slots = a.lookahead_slots or slots
    values = {name: value_gate.fit(sas["valid"], look) for name, look in tuning.GATES.items()}
    doc = {"commit": TR._commit(), "data": TR._shown(a.data),
           "command": " ".join(["python -m benchmarks.experiments.value_gate", *(
               argv if argv is not None else sys.argv[1:])]),
           "settings": {"prompts": a.prompts, "blocks": a.blocks, "seeds": a.seeds,
                        "rounds": value_gate.ROUNDS, "depth": value_gate.DEPTH,
                        "rate": value_gate.RATE, "lookahead_slots": a.lookahead_slots,
                        "lookahead_futures": futures},
           "out": TR._shown(a.out), "budgets": []}
    for budget in a.budgets:
        print(f"budget {budget}: tuning on valid", file=sys.stderr)
        ls, _ = headroom.tune_position_leniency(sas["valid"], budget)
        trees = {REFERENCE: headroom.position_leniency_tree(ls)}
        cap = _offline(trees[REFERENCE], sas["valid"])["tv_p99"]
        params = {REFERENCE: {"l": list(ls)}}
        for name, value in values.items():
            tuned = value_gate.tune(value, sas["valid"], budget, cap)
            if tuned is None:
                continue
            trees[LABELS[name]] = value_gate.gate_tree(value, tuned[0], cap)
            params[LABELS[name]] = {"lambda": tuned[0], "tv_cap": cap,
                                    "estimate": tuning.GATES[name]}
        offline = {k: {**_offline(t, sas["test"]), "params": params[k]}
                   for k, t in trees.items()}
        free = []
        for seed in a.seeds:
            print(f"budget {budget}: free-running, seed {seed}, {a.prompts} prompts",
                  file=sys.stderr)
            free.append(paired.compare(pair, {k: TreeRule(treeio.parse(t), k)
                                              for k, t in trees.items()},
                                       split="test", prompts=a.prompts, blocks=a.blocks,
                                       seed=seed, lookahead_slots=a.lookahead_slots))
        doc["budgets"].append({"budget": budget, "tv_cap": cap, "offline_test": offline,
                               "free_running_test": free, "spread": spread(free)})
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{a.out}: written ({doc['seconds']} s)", file=sys.stderr)
    if a.page:
        TR.write_page(doc, a.section, markdown)
    print(markdown(doc))
    return 0


def spread(free: list) -> dict:
    """Per gate: the mean and standard deviation over seeds of its free-running
    difference from the reference in tokens per call."""
    out = {}
    for label in free[0]["versus_reference"]:
        d = [f["versus_reference"][label]["tokens_per_call"]["difference"] for f in free]
        out[label] = {"mean": float(np.mean(d)),
                      "sd": float(np.std(d, ddof=1)) if len(d) > 1 else None}
    return out


def _ci(x: dict) -> str:
    if x.get("difference") is None:
        return "-"
    lo, hi = x["ci95"]
    return f"{x['difference']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def markdown(doc: dict) -> str:
    s = doc["settings"]
    seeds = ", ".join(map(str, s["seeds"]))
    lines = [f"Generated by `{doc['command']}` at commit {doc['commit']}: the models fit "
             f"and λ tuned on valid, reported on test; free-running on {s['prompts']} test "
             f"prompts x {s['blocks']} blocks, once per seed of the uniforms ({seeds}); "
             f"figures in `{doc.get('out', 'benchmarks/experiments/value_gate.json')}`."]
    for b in doc["budgets"]:
        first = b["free_running_test"][0]
        lines += ["", f"**TV budget {b['budget']:g}** (each slot's spend capped at "
                  f"{b['tv_cap']:.4f}, the reference's slot-TV p99 on valid; free-running "
                  f"columns: seed {s['seeds'][0]}):", "",
                  "| rule | offline tokens/call | offline TV/token | slot TV p99 | KL/token "
                  "| free-running tokens/call | free-running TV/token | minus the reference "
                  "(95% interval) |",
                  "|---|---|---|---|---|---|---|---|"]
        for label, o in b["offline_test"].items():
            est = o["params"].get("estimate", False)
            fr = first["rules"][label]
            tv = f"{fr['tv_per_token']:.4f}" + (f" ± {fr['tv_se']:.4f} (estimate)"
                                               if fr["distortion"]["kind"] == "estimate"
                                               else "")
            diff = "(reference)" if label == first["reference"] else \
                _ci(first["versus_reference"][label]["tokens_per_call"])
            lines.append(f"| {label} | {o['tokens_per_call']:.4f}"
                         f"{' (estimate)' if est else ''} | {o['tv_per_token']:.4f} | "
                         f"{o['tv_p99']:.4f} | {o['kl_per_token']:.4f} | "
                         f"{fr['tokens_per_call']:.4f} ± {fr['tokens_se']:.4f} | {tv} | "
                         f"{diff} |")
        lines.append("")
        for label, sp in b["spread"].items():
            per = "; ".join(f"seed {f['seed']}: "
                            + _ci(f["versus_reference"][label]["tokens_per_call"])
                            for f in b["free_running_test"])
            over = f"{sp['mean']:+.4f}" + ("" if sp["sd"] is None else f" ± {sp['sd']:.4f}")
            lines.append(f"- {label} minus the reference, tokens per call: {per}; over "
                         f"seeds {over} (mean ± sd).")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
