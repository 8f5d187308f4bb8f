"""What it costs to hold the answer's first tokens to the average: ``--cap-tv-first``.

A rule searched to a TV budget per token may spend more of it where the answer starts.
For each trace directory, budget and seed, this runs the search twice with the same
seed: plain (``evolve run --objective speed --budget-tv B``) and with the mean slot TV
over the first K tokens after the prompt capped at the budget itself (``--cap-tv-first
B --first-tokens K``: the answer's first tokens get no more than the average). It
reports, on test and exactly on the recorded path, each champion's tokens per call, TV
per token and TV over the first K tokens (reach-weighted, as ``tv_by_distance`` of
the reports), and capped minus plain paired by seed (mean and the range over seeds).

    python -m benchmarks.experiments.first_tokens [--data DIR ...] [--budgets 0.01 0.03]
        [--seeds 1 2 3 4 5] [--first-tokens 1] [--page]

The figures go to ``benchmarks/experiments/first_tokens.json``; ``--page`` writes the
section of docs/results/real-pair.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT, write_section  # noqa: E402

import numpy as np  # noqa: E402

import evolve  # noqa: E402
from evolve.io import paths  # noqa: E402
from benchmarks.experiments.trace_results import _commit, _shown  # noqa: E402

OUT = ROOT / "benchmarks" / "experiments" / "first_tokens.json"
SECTION = "first-tokens"
DATA = (paths.DATA_DIR / "pairs" / "smollm2" / "results" / "traces", paths.DATA_DIR / "traces")


def champion(data: Path, runs: Path, budget: float, seed: int, k: int, cap: bool, a) -> dict:
    name = f"{'capped' if cap else 'plain'}-b{budget:g}-s{seed}"
    opts = dict(objective="speed", tv_budget=budget, seed=seed, population=a.population,
                generations=a.generations, seed_baselines=True, tournament=3)
    if cap:
        opts.update(tv_first_cap=budget, first_tokens=k)
    res = evolve.run(data_dir=data, runs_dir=runs, name=name, writeback=False, force=True,
                     **opts)
    t = res.champion["metrics"]["test"]
    return {"seed": seed, "expression": res.champion["expression"],
            "tokens_per_call": t["tokens_per_call"], "tv_per_token": t["tv_per_token"],
            "tv_first": t["tv_first"][k - 1], "tv_first_token": t["tv_first"][0]}


def _spread(x) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, nargs="+", default=None,
                    help="trace directories [the real pair's, the default traces: those "
                         "there]")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.03])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--first-tokens", type=int, default=1)
    ap.add_argument("--population", type=int, default=300)
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--page", action="store_true",
                    help="write the section of docs/results/real-pair.md")
    a = ap.parse_args(argv)
    data = a.data or [d for d in DATA if (d / "test.npz").exists()]
    if not data:
        raise SystemExit("no trace directory: record one (evolve data trace) or pass --data")
    k = a.first_tokens
    t0 = time.perf_counter()
    doc = {"commit": _commit(),
           "command": " ".join(["python -m benchmarks.experiments.first_tokens",
                                *(_shown(Path(x)) if Path(x).is_absolute() else x
                                  for x in (argv if argv is not None else sys.argv[1:]))]),
           "out": _shown(a.out), "first_tokens": k, "population": a.population, "generations": a.generations,
           "data": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for d in data:
            rows = []
            for b in a.budgets:
                plain = [champion(d, Path(tmp), b, s, k, False, a) for s in a.seeds]
                capped = [champion(d, Path(tmp), b, s, k, True, a) for s in a.seeds]
                diff = {m: _spread([c[m] - p[m] for p, c in zip(plain, capped)])
                        for m in ("tokens_per_call", "tv_per_token", "tv_first")}
                rows.append({"budget": b, "plain": plain, "capped": capped,
                             "capped_minus_plain": diff})
                print(f"{_shown(d)} budget {b:g}: done", file=sys.stderr, flush=True)
            doc["data"][_shown(d)] = rows
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    text = markdown(doc)
    if a.page:
        write_section(text, SECTION)
    print(text)
    return 0


def markdown(doc: dict) -> str:
    k = doc["first_tokens"]
    first = "the first token" if k == 1 else f"the first {k} tokens"
    lines = [f"Generated by `{doc['command']}` at commit {doc['commit']} "
             f"({doc['seconds'] / 60:.0f} minutes on 2 shared cores; population "
             f"{doc['population']}, {doc['generations']} generations, one start per seed); "
             f"figures in `{doc.get('out', _shown(OUT))}`. Test split, exact on "
             f"the recorded path; TV over {first} after the prompt is reach-weighted.", ""]
    for d, rows in doc["data"].items():
        lines += [f"**`{d}`**", "",
                  f"| budget | champion | tokens/call | TV/token | TV over {first} |",
                  "|---|---|---|---|---|"]
        for r in rows:
            for kind in ("plain", "capped"):
                cs = r[kind]

                def rng(m):
                    s = _spread([c[m] for c in cs])
                    return f"{s['mean']:.4f} ({s['min']:.4f} to {s['max']:.4f})"
                label = "plain" if kind == "plain" else f"`--cap-tv-first {r['budget']:g}`"
                lines.append(f"| {r['budget']:g} | {label} | {rng('tokens_per_call')} | "
                             f"{rng('tv_per_token')} | {rng('tv_first')} |")
            dd = r["capped_minus_plain"]

            def delta(m, digits=4):
                s = dd[m]
                return (f"{s['mean']:+.{digits}f} ({s['min']:+.{digits}f} to "
                        f"{s['max']:+.{digits}f})")
            lines.append(f"| {r['budget']:g} | capped minus plain, paired by seed | "
                         f"{delta('tokens_per_call')} | {delta('tv_per_token')} | "
                         f"{delta('tv_first')} |")
        lines.append("")
    lines.append(f"*Mean over {len(doc['data'][next(iter(doc['data']))][0]['plain'])} seeds, "
                 "with the smallest and largest in brackets.*")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
