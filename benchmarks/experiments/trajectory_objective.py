"""Does a search variant close the offline/free-running gap, or beat the best baseline?

For every TV budget and seed, evolves a champion of the objective ``speed`` twice on
the same n-gram traces (``evolve.search.engine.Evolution``, the loop of `evolve run`):
plain, and with the variant ``--variant``:

- ``trajectory`` (the default): ``trajectory=True``, the importance-weighted
  estimate of ``evolve.objectives.trajectory_objective`` as the objective (ESS floor
  ``--ess-floor``);
- ``lookahead``: ``lookahead=True``, the search also offered the lookahead inputs
  (``next_tv``, ``ahead``: the block's later slots, ``evolve.lang.features``), which
  the offline objective scores by an estimate.

The best baseline family tuned on valid to the same budget (``evolve.rules.tuning``)
is the reference. On the test split, for every champion and the reference:

- offline tokens per call (every recorded block from the standard rule's context),
- the trajectory-aware estimate (the same blocks importance-weighted), and
- free-running decoding from the test traces' own prompts and uniforms
  (``evolve.data.decode``), with the exact TV per token along the rule's own
  trajectory (``evolve.data.sources.ngram_free``'s slot distortion);

then each champion's margin over the reference by all three (paired by sequence,
standard errors by sequence), and its gap: offline margin minus free-running margin.
Across seeds: the spread, and the paired comparison of the two objectives (the same
seed's champions), mean +- standard error over seeds. Also the train kernel's seconds
per program of either objective. Usage:

    python -m benchmarks.experiments.trajectory_objective [--variant trajectory|lookahead]
        [--smoke] [--seeds 0 1 2]
        [--budgets 0.01 0.03] [--train-prompts 2048] [--test-prompts 2048] [--blocks 16]
        [--generations 15] [--population 100] [--out FILE]

The default ``--out`` is benchmarks/experiments/trajectory_objective.json, or
benchmarks/experiments/lookahead.json with ``--variant lookahead``.
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
from evolve.data.sources import ngram, ngram_free  # noqa: E402
from evolve.io import paths  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.objectives import trajectory as TR  # noqa: E402
from evolve.rules import tuning  # noqa: E402
from evolve.rules.adapters import TreeRule  # noqa: E402
from evolve.search.config import Config  # noqa: E402
from evolve.search.engine import Evolution  # noqa: E402

VARIANTS = ("trajectory", "lookahead")
OBJECTIVES = ("plain", "trajectory")      # the variant compared (main sets it)


def _mean_se(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    se = float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan")
    return {"mean": float(x.mean()), "se": se}


def trace_config(a) -> ngram.TraceConfig:
    base = (ngram.TraceConfig(seed=3, max_files=60, max_bytes_per_file=40_000)
            if a.smoke else ngram.TraceConfig())
    return replace(base, train_prompts=a.train_prompts, valid_prompts=a.valid_prompts,
                   test_prompts=a.test_prompts, blocks_per_prompt=a.blocks)


def load_traces(directory: Path, cfg: ngram.TraceConfig) -> dict:
    if not (directory / "test.npz").exists():
        print(f"recording traces in {directory}", file=sys.stderr)
        ngram.build_splits(cfg, directory)
    splits = traces.load_splits(directory)
    if ngram.config_of(splits["train"]) != cfg:
        raise SystemExit(f"{directory}: traces of another configuration; remove the "
                         "directory or pass --traces")
    return splits


def best_baseline(sa_valid, budget: float):
    """(label, tree) of the family with the most valid tokens per call at the budget."""
    best = None
    for name in tuning.families():
        if tuning.scorable(name, sa_valid) is not None:
            continue
        p = tuning.tune(name, sa_valid, budget)
        if p is not None and (best is None or p.tokens > best.tokens):
            best = p
    label = best.rule if best.param is None else f"{best.rule} ({best.param:.4g})"
    return label, tuning.RULES[best.rule].tree(best.param)


class TestBench:
    """A rule's numbers on the test split, per sequence (offline, trajectory-aware and
    free-running from the traces' own prompts and uniforms)."""

    def __init__(self, ts, cfg):
        self.sa, self.tb = spec.TraceArrays.from_split(ts), TR.TraceBlocks.from_split(ts)
        self.pair = ngram.build_pair(cfg)
        self.cfg = cfg

    def measure(self, tree: str) -> dict:
        nodes = treeio.parse(tree)
        h = tuning.tree_thresholds(nodes, self.sa)
        plain = TR.sequence_tokens(self.sa, self.tb, h, trajectory=False)[0]
        weighted = TR.sequence_tokens(self.sa, self.tb, h)
        est = TR.summary(weighted)
        off = spec.objectives(self.sa, h)
        rule = TreeRule(nodes, "rule")
        pr, rngs = ngram.prompt_starts(self.pair, "test", self.cfg.test_prompts)
        cols, acc = DEC.decode(self.pair, pr, rngs, self.cfg.blocks_per_prompt, rule=rule)
        g = self.cfg.block_size
        reached = cols["block_position"] <= np.repeat(acc.reshape(-1), g)
        tv, _ = ngram_free.slot_distortion(self.pair, cols, reached, rule)
        free = (acc + 1.0).mean(axis=1)
        return {"offline": plain, "trajectory": weighted[0], "free": free,
                "tv": {"offline": off.tv_per_token, "trajectory": est.tv_per_token,
                       "free_running": float(tv.sum() / (acc + 1.0).sum())},
                "effective_sequences": est.effective_sequences}


def evolve_champion(splits, budget, seed, variant, a) -> dict:
    """The champion of one search: ``variant`` None (plain), "trajectory" or "lookahead"."""
    cfg = Config(objective="speed", tv_budget=budget, trajectory=variant == "trajectory",
                 lookahead=variant == "lookahead",
                 ess_floor=a.ess_floor, generations=a.generations, population=a.population,
                 seed=seed, seed_baselines=True)
    t0 = time.perf_counter()
    ev = Evolution(cfg, splits["train"], splits["valid"])
    ev.initialise()
    for _ in range(a.generations):
        ev.step()
    champ = ev.champion()
    return {"tree": champ.tree, "seconds": time.perf_counter() - t0,
            "train_kernel_seconds": ev.train.kernel_seconds,
            "train_programs": ev.train.kernel_programs}


def margins(rule: dict, ref: dict) -> dict:
    m = {k: rule[k] - ref[k] for k in ("offline", "trajectory", "free")}
    return {"margin": {k: _mean_se(v) for k, v in m.items()},
            "gap": {"offline": _mean_se(m["offline"] - m["free"]),
                    "trajectory": _mean_se(m["trajectory"] - m["free"])},
            "tv": rule["tv"], "effective_sequences": rule["effective_sequences"]}


def across_seeds(runs: dict) -> dict:
    """Per objective: mean, spread of the margins and gaps over seeds; the objectives
    compared seed by seed (the variant minus plain), mean +- se over seeds."""
    variant = OBJECTIVES[1]
    out = {}
    keys = {"free_margin": ("margin", "free"), "offline_margin": ("margin", "offline"),
            "gap": ("gap", "offline"), "tv_free_running": ("tv", "free_running")}
    for obj in OBJECTIVES:
        out[obj] = {}
        for k, (a, b) in keys.items():
            v = np.array([r[obj][a][b]["mean"] if a != "tv" else r[obj][a][b]
                          for r in runs.values()])
            out[obj][k] = {**_mean_se(v), "min": float(v.min()), "max": float(v.max())}
    diff = {}
    for k, (a, b) in keys.items():
        if a == "tv":
            continue
        d = [r[variant][a][b]["mean"] - r["plain"][a][b]["mean"] for r in runs.values()]
        dabs = [abs(r[variant][a][b]["mean"]) - abs(r["plain"][a][b]["mean"])
                for r in runs.values()]
        diff[k] = _mean_se(d)
        if k == "gap":
            diff["abs_gap"] = _mean_se(dabs)
    out[f"{variant}_minus_plain"] = diff
    return out


def kernel_cost(train, population: int, repeats: int) -> dict:
    """Median seconds per program of the train kernel, plain and trajectory, on the same
    random first population (the calls interleaved, so a busy machine slows both)."""
    from evolve.lang import treeio as TI
    from evolve.objectives import bind
    cfgs = {o: Config(objective="speed", trajectory=o == "trajectory", population=population)
            for o in OBJECTIVES}
    ev0 = Evolution(cfgs["plain"], train, train)
    with ev0._random():                   # the engine's own random first trees
        trees = sorted({str(ev0.Individual(ev0.toolbox.expr())) for _ in range(population)})
    progs = TI.linearise([TI.parse(t) for t in trees])
    evs = {o: bind(cfgs[o]).evaluator(train, "train", cfgs[o]) for o in OBJECTIVES}
    times: dict = {o: [] for o in OBJECTIVES}
    for o in OBJECTIVES:                  # compile and warm
        evs[o].run(progs)
    for _ in range(repeats):
        for o in OBJECTIVES:
            t = time.perf_counter()
            evs[o].run(progs)
            times[o].append((time.perf_counter() - t) / len(trees))
    return {"programs": len(trees), "repeats": repeats,
            **{o: 1e3 * float(np.median(v)) for o, v in times.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS, default="trajectory")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.03])
    ap.add_argument("--train-prompts", type=int, default=2048)
    ap.add_argument("--valid-prompts", type=int, default=1024)
    ap.add_argument("--test-prompts", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--generations", type=int, default=15)
    ap.add_argument("--population", type=int, default=100)
    ap.add_argument("--ess-floor", type=float, default=0.1)
    ap.add_argument("--traces", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny traces and runs (a test)")
    ap.add_argument("--cost-only", action="store_true",
                    help="only time the train kernel of both objectives (ms per program)")
    a = ap.parse_args(argv)
    global OBJECTIVES
    OBJECTIVES = ("plain", a.variant)
    if a.out is None:
        a.out = ROOT / "benchmarks" / "experiments" / ("trajectory_objective.json" if a.variant == "trajectory"
                                       else f"{a.variant}.json")
    if a.smoke:
        a.seeds, a.budgets = a.seeds[:2], a.budgets[:1]
        a.train_prompts, a.valid_prompts, a.test_prompts = 32, 32, 32
        a.blocks, a.generations, a.population = 4, 2, 16
    t0 = time.perf_counter()
    cfg = trace_config(a)
    tag = f"{cfg.train_prompts}-{cfg.valid_prompts}-{cfg.test_prompts}-{cfg.blocks_per_prompt}"
    directory = a.traces or paths.RUNS_DIR / "trajectory-objective" / (
        ("smoke-" if a.smoke else "") + tag)
    splits = load_traces(directory, cfg)
    if a.cost_only and a.variant != "trajectory":
        raise SystemExit("--cost-only times the trajectory objective's kernel")
    if a.cost_only:
        c = kernel_cost(splits["train"], a.population, 2 if a.smoke else 5)
        print(f"train kernel, median of {c['repeats']} calls on {c['programs']} programs "
              f"({cfg.train_prompts} sequences x {cfg.blocks_per_prompt} blocks): plain "
              f"{c['plain']:.2f} ms, trajectory {c['trajectory']:.2f} ms per program")
        return 0
    bench = TestBench(splits["test"], cfg)
    sa_valid = spec.TraceArrays.from_split(splits["valid"])
    doc = {"command": " ".join(["python -m benchmarks.experiments.trajectory_objective",
                                *(argv if argv is not None else sys.argv[1:])]),
           "traces": {"train_prompts": cfg.train_prompts, "valid_prompts": cfg.valid_prompts,
                      "test_prompts": cfg.test_prompts, "blocks": cfg.blocks_per_prompt},
           "generations": a.generations, "population": a.population,
           "ess_floor": a.ess_floor, "seeds": a.seeds, "variant": a.variant, "budgets": []}
    cost = {o: [0.0, 0] for o in OBJECTIVES}
    for budget in a.budgets:
        label, tree = best_baseline(sa_valid, budget)
        ref = bench.measure(tree)
        b = {"budget": budget, "reference": {"rule": label, "tree": tree,
                                             "free_running": _mean_se(ref["free"]),
                                             "tv": ref["tv"]}, "seeds": {}}
        for seed in a.seeds:
            row = {}
            for obj in OBJECTIVES:
                champ = evolve_champion(splits, budget, seed, None if obj == "plain" else obj, a)
                cost[obj][0] += champ["train_kernel_seconds"]
                cost[obj][1] += champ["train_programs"]
                row[obj] = {"tree": champ["tree"], **margins(bench.measure(champ["tree"]), ref)}
                m = row[obj]["margin"]
                print(f"budget {budget:g} seed {seed} {obj}: margin offline "
                      f"{m['offline']['mean']:+.4f}, free-running {m['free']['mean']:+.4f} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
            b["seeds"][str(seed)] = row
        b["summary"] = across_seeds(b["seeds"])
        doc["budgets"].append(b)
    doc["train_kernel_ms_per_program"] = {o: 1e3 * s / max(n, 1) for o, (s, n) in cost.items()}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(markdown(doc))
    print(f"{a.out}: written ({doc['seconds']} s)", file=sys.stderr)
    return 0


def _f(x: dict, sign: bool = True) -> str:
    return f"{x['mean']:{'+' if sign else ''}.4f} ± {x['se']:.4f}"


def markdown(doc: dict) -> str:
    t = doc["traces"]
    variant = doc.get("variant", "trajectory")
    lines = [f"`{doc['command']}`: n-gram traces of {t['train_prompts']} train / "
             f"{t['valid_prompts']} valid / {t['test_prompts']} test prompts x {t['blocks']} "
             f"blocks; {doc['generations']} generations of {doc['population']}, seeds "
             f"{', '.join(map(str, doc['seeds']))}; variant {variant}"
             + (f" (ESS floor {doc['ess_floor']:g})" if variant == "trajectory" else "")
             + ". Margins "
             "are over the best baseline tuned on valid to the budget, on test, ± one "
             "standard error by sequence; across seeds, ± one standard error over seeds.", ""]
    for b in doc["budgets"]:
        ref = b["reference"]
        lines += [f"**TV budget {b['budget']:g}** (reference: {ref['rule']}, free-running "
                  f"{_f(ref['free_running'], False)} tokens/call, free-running TV "
                  f"{ref['tv']['free_running']:.4f})", "",
                  "| seed | objective | margin offline | margin trajectory-aware | "
                  "margin free-running | gap (offline - free) | free-running TV |",
                  "|---|---|---|---|---|---|---|"]
        for seed, row in b["seeds"].items():
            for obj, r in row.items():
                m = r["margin"]
                lines.append(f"| {seed} | {obj} | {_f(m['offline'])} | {_f(m['trajectory'])} | "
                             f"{_f(m['free'])} | {_f(r['gap']['offline'])} | "
                             f"{r['tv']['free_running']:.4f} |")
        s = b["summary"]
        lines += ["", "| across seeds | margin offline | margin free-running | gap | "
                  "free-running TV |", "|---|---|---|---|---|"]
        for obj in ("plain", variant):
            o = s[obj]
            lines.append(f"| {obj} | {_f(o['offline_margin'])} | {_f(o['free_margin'])} | "
                         f"{_f(o['gap'])} [{o['gap']['min']:+.4f}, {o['gap']['max']:+.4f}] | "
                         f"{o['tv_free_running']['mean']:.4f} |")
        d = s[f"{variant}_minus_plain"]
        lines += ["", f"{variant} minus plain, paired by seed: gap {_f(d['gap'])}, |gap| "
                  f"{_f(d['abs_gap'])}, free-running margin {_f(d['free_margin'])}, offline "
                  f"margin {_f(d['offline_margin'])}.", ""]
    k = doc["train_kernel_ms_per_program"]
    lines.append(f"Train kernel per program: plain {k['plain']:.2f} ms, {variant} "
                 f"{k[variant]:.2f} ms.")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
