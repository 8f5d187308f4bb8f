"""How far the offline estimates are from free-running decoding, plain and trajectory-aware.

Takes the rules of a results file of `benchmarks/experiments/trace_results.py` (tuned
leniency, per-position leniency and the evolved champions, per TV budget),
records n-gram traces with a large test split (`--prompts` prompts x 16 blocks,
the configuration of the default traces otherwise), and for every rule measures
on the same test prompts:

- the plain offline estimate of tokens per call (`evolve.objectives.spec`: every
  recorded block from the standard rule's context),
- the trajectory-aware estimate (`evolve.objectives.trajectory`: the same blocks
  importance-weighted to the rule's own trajectory), and
- free-running decoding with the rule from the same prompts with the same
  uniforms as the recorded traces (`evolve.data.decode`),

then each rule's margin over tuned leniency by all three, and the gap of each
estimate from free-running (per rule and per margin, paired by sequence, with
standard errors by sequence). Writes the figures to --out. Usage:

    python -m benchmarks.experiments.trajectory_gap [--prompts 8192] [--quick]
        [--results benchmarks/experiments/trace_results.json] [--out benchmarks/experiments/trajectory_gap.json] [--page]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

import numpy as np  # noqa: E402

from evolve.data import decode as DEC  # noqa: E402
from evolve.data import traces  # noqa: E402
from evolve.data.sources import ngram  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.objectives import trajectory as TR  # noqa: E402
from evolve.rules import headroom, tuning  # noqa: E402
from evolve.rules.adapters import TreeRule  # noqa: E402
from evolve.io import paths  # noqa: E402
from benchmarks.experiments.trace_results import write_page  # noqa: E402

REFERENCE = "leniency (tuned)"


def _mean_se(x: np.ndarray) -> dict:
    return {"mean": float(x.mean()), "se": float(x.std(ddof=1) / np.sqrt(x.size))}


def _rules(budget: dict) -> dict:
    """label -> parsed tree, from one budget of a trace_results.py results file."""
    off = budget["offline_test"]
    rules = {REFERENCE: tuning.RULES["leniency"].tree(off[REFERENCE]["params"]["l"]),
             "per-position leniency (tuned)": headroom.position_leniency_tree(
                 off["per-position leniency (tuned)"]["params"]["l"])}
    rules.update({label: r["tree"] for label, r in budget["runs"].items()})
    return {k: treeio.parse(v) for k, v in rules.items()}


def _traces(out_dir: Path, prompts: int, quick: bool):
    base = (ngram.TraceConfig(seed=3, max_files=60, max_bytes_per_file=40_000,
                              blocks_per_prompt=8) if quick
            else ngram.config_of(traces.load(paths.TRACES_DIR / "test.npz")))
    cfg = replace(base, train_prompts=8, valid_prompts=8, test_prompts=prompts)
    if not (out_dir / "test.npz").exists():
        print(f"recording {prompts} test prompts x {cfg.blocks_per_prompt} blocks in {out_dir}",
              file=sys.stderr)
        ngram.build_splits(cfg, out_dir)
    ts = traces.load(out_dir / "test.npz", "test")
    have = ngram.config_of(ts)      # the train and valid prompt counts do not matter here
    if replace(have, train_prompts=8, valid_prompts=8) != cfg:
        raise SystemExit(f"{out_dir}: traces of another configuration (or not {prompts} test "
                         "prompts); remove the directory or pass --prompts")
    return ts, have


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "experiments" / "trace_results.json")
    ap.add_argument("--prompts", type=int, default=8192)
    ap.add_argument("--traces", type=Path, default=paths.RUNS_DIR / "trajectory-gap" / "traces")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "experiments" / "trajectory_gap.json")
    ap.add_argument("--quick", action="store_true", help="tiny traces (a smoke test)")
    ap.add_argument("--page", "--readme", dest="page", action="store_true",
                    help="write the tables between the trajectory-gap markers of "
                         "docs/results/trajectory.md")
    a = ap.parse_args(argv)
    if a.quick:
        a.prompts = min(a.prompts, 64)
    t0 = time.perf_counter()
    ts, cfg = _traces(a.traces, a.prompts, a.quick)
    sa, tb = spec.TraceArrays.from_split(ts), TR.TraceBlocks.from_split(ts)
    pair = ngram.build_pair(cfg)
    blocks = cfg.blocks_per_prompt
    doc = {"command": " ".join(["python -m benchmarks.experiments.trajectory_gap",
                                *(argv if argv is not None else sys.argv[1:])]),
           "results": str(a.results), "prompts": a.prompts, "blocks": blocks, "budgets": []}
    for budget in json.loads(a.results.read_text())["budgets"]:
        per_seq, rows = {}, {}
        for label, nodes in _rules(budget).items():
            h = tuning.tree_thresholds(nodes, sa)
            plain = TR.sequence_tokens(sa, tb, h, trajectory=False)[0]
            weighted = TR.sequence_tokens(sa, tb, h)
            traj, est = weighted[0], TR.summary(weighted)
            pr, rngs = ngram.prompt_starts(pair, "test", a.prompts)     # the traces' own
            _, acc = DEC.decode(pair, pr, rngs, blocks, rule=TreeRule(nodes, label),
                                record=False)
            free = (acc + 1.0).mean(axis=1)
            per_seq[label] = {"offline": plain, "trajectory": traj, "free": free}
            rows[label] = {"offline": _mean_se(plain), "trajectory": _mean_se(traj),
                           "free_running": _mean_se(free),
                           "offline_minus_free": _mean_se(plain - free),
                           "trajectory_minus_free": _mean_se(traj - free),
                           "effective_sequences": est.effective_sequences,
                           "tv_trajectory": est.tv_per_token}
            print(f"budget {budget['budget']:g} {label}: offline {plain.mean():.4f}, trajectory "
                  f"{traj.mean():.4f}, free-running {free.mean():.4f}", file=sys.stderr)
        ref = per_seq[REFERENCE]
        for label, s in per_seq.items():
            if label == REFERENCE:
                continue
            m = {k: s[k] - ref[k] for k in ("offline", "trajectory", "free")}
            rows[label]["margin"] = {k: _mean_se(v) for k, v in m.items()}
            rows[label]["margin_gap"] = {"offline": _mean_se(m["offline"] - m["free"]),
                                         "trajectory": _mean_se(m["trajectory"] - m["free"])}
        doc["budgets"].append({"budget": budget["budget"], "rules": rows})
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    print(f"{a.out}: written ({doc['seconds']} s)", file=sys.stderr)
    if a.page:
        write_page(doc, "trajectory-gap", markdown)
    return 0


def _f(x: dict, sign: bool = False) -> str:
    return f"{x['mean']:{'+' if sign else ''}.4f} ± {x['se']:.4f}"


def markdown(doc: dict) -> str:
    lines = [f"`{doc['command']}`: {doc['prompts']} test prompts x {doc['blocks']} blocks, the "
             "same prompts and uniforms for the traces and every rule's free-running decoding; "
             "± one standard error by sequence.", ""]
    for b in doc["budgets"]:
        lines += [f"**TV budget {b['budget']:g}**", "",
                  "| rule | free-running tokens/call | offline minus free-running | "
                  "trajectory-aware minus free-running | margin over tuned leniency: "
                  "free-running | offline | trajectory-aware | effective sequences |",
                  "|---|---|---|---|---|---|---|---|"]
        for label, r in b["rules"].items():
            m = r.get("margin")
            marg = ("(reference) | | " if m is None else
                    f"{_f(m['free'], True)} | {_f(m['offline'], True)} | "
                    f"{_f(m['trajectory'], True)}")
            lines.append(f"| {label} | {_f(r['free_running'])} | "
                         f"{_f(r['offline_minus_free'], True)} | "
                         f"{_f(r['trajectory_minus_free'], True)} | {marg} | "
                         f"{r['effective_sequences']:.0f} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
