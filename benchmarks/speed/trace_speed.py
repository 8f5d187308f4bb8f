"""How fast trace runs are: the trace kernel per node against the token kernel, and
a trace run of this checkout against another checkout, alternating.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.trace_speed [--before DIR] [--rounds 3] [--json FILE] [--smoke]

1. kernel  One random population (the token primitives, so both kernels read the
           same trees: heights 2..6, seed 20240611, as ``benchmarks/speed/harness.py``)
           scored by the token kernel over the token train split and by the trace
           kernel over the trace train split (every candidate row of every drafted
           position), one thread and all threads, median of ``--repeats``; node
           evaluations per second count every node times every row it is
           evaluated on (candidate rows for the trace kernel).
2. run     ``evolve run --objective speed --budget-tv 0.03 --generations 30
           --population 500 --seed 2`` on the default traces, in a fresh process,
           warm Numba cache: wall seconds, the generations' seconds and their
           kernel seconds (history.jsonl). With ``--before DIR`` (a checkout of an
           older commit, e.g. ``git worktree add /tmp/before <commit>``) the same
           command runs there too, the two alternating for ``--rounds`` rounds
           (one sitting, the same data), and the runs' histories (without
           timings) and champions are compared.

Prints a table and, with ``--json``, writes the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

RUN = ["--objective", "speed", "--budget-tv", "0.03", "--generations", "30",
       "--population", "500", "--seed", "2"]
SMOKE_RUN = ["--objective", "speed", "--budget-tv", "0.03", "--generations", "2",
             "--population", "20", "--seed", "2"]


def progs_nodes(n: int) -> list:
    """The speed benchmark's random population (token primitives, heights 2..6), as
    node lists."""
    from evolve.lang import primitives as P
    from evolve.lang import treeio
    from benchmarks.speed.sizes import FULL, random_trees
    return [treeio.from_deap(t) for t in random_trees(
        P.make_pset(), n, FULL.pop_min_height, FULL.pop_max_height, FULL.pop_seed)]


def _trees(n: int):
    from evolve.lang import treeio
    return treeio.linearise(progs_nodes(n))


ROW_LEVEL = {"position", "draft_entropy", "target_entropy", "block_position", "p_max", "q_max"}


def row_level_share(trees: list) -> float:
    """The share of nodes whose subtree reads only per-position inputs (and constants):
    the same value for every candidate of a drafted position, so a kernel could
    evaluate them once per position instead of once per candidate."""
    total = row = 0
    for nodes in trees:
        def walk(i):
            nonlocal total, row
            n = nodes[i]
            j, level = i + 1, n.kind == "const" or n.name in ROW_LEVEL
            if n.kind == "prim":
                level = True
                for _ in range(n.arity):
                    j, child = walk(j)
                    level = level and child
            total += 1
            row += level
            return j, level
        walk(0)
    return row / total


def _median_time(fn, repeats: int) -> float:
    fn()                                     # compile or load, and warm the caches
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def kernel_section(trees: int, repeats: int, token_dir: Path, trace_dir: Path) -> dict:
    import numba

    from evolve.data import tokens, traces
    from evolve.kernels import speculative, tokens as tk
    from evolve.lang import treeio
    from evolve.objectives import spec
    progs = _trees(trees)
    nodes = int(progs.lengths.sum())
    split = tk.TokenArrays(tokens.load_npz(token_dir / "train.npz"))
    sa = spec.TraceArrays.from_split(traces.load(trace_dir / "train.npz"))
    rows = {"token": split.n, "trace": sa.n * sa.k}
    consts = treeio.linearise([treeio.parse("0.5")] * len(progs))
    runs = {"token": lambda: tk.population_counts(progs, split),
            "trace": lambda: speculative.population_sums(progs, sa, with_kl=False),
            "trace_kl": lambda: speculative.population_sums(progs, sa, with_kl=True),
            "trace_sums_only": lambda: speculative.population_sums(consts, sa, with_kl=False)}
    out = {"trees": len(progs), "nodes": nodes, "token_rows": rows["token"],
           "trace_candidate_rows": rows["trace"], "threads": numba.get_num_threads(),
           "row_level_node_share": row_level_share(progs_nodes(trees))}
    all_threads = numba.get_num_threads()
    for threads in sorted({1, all_threads}):
        numba.set_num_threads(threads)
        for name, fn in runs.items():
            s = _median_time(fn, repeats)
            r = rows["token" if name == "token" else "trace"]
            out[f"{name}_{threads}t_s"] = s
            out[f"{name}_{threads}t_node_evals_per_s"] = nodes * r / s
    numba.set_num_threads(all_threads)
    for threads in sorted({1, all_threads}):
        out[f"ratio_trace_vs_token_{threads}t"] = (out[f"trace_{threads}t_node_evals_per_s"]
                                                   / out[f"token_{threads}t_node_evals_per_s"])
        out[f"sums_share_{threads}t"] = (out[f"trace_sums_only_{threads}t_s"]
                                         / out[f"trace_{threads}t_s"])
    return out


def one_run(checkout: Path, data: Path, args: list[str]) -> dict:
    """The trace run in a fresh process of ``checkout``: wall and history seconds."""
    with tempfile.TemporaryDirectory(prefix="evolve-trace-speed-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(checkout), NO_COLOR="1")
        cmd = [sys.executable, "-m", "evolve", "run", *args, "--data", str(data),
               "--runs-dir", tmp, "--name", "r", "--no-writeback"]
        t = time.perf_counter()
        subprocess.run(cmd, cwd=checkout, env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t
        hist = [json.loads(line) for line in
                (Path(tmp) / "r" / "history.jsonl").read_text().splitlines()]
        timing = [h.pop("timing") for h in hist]
        champ = json.loads((Path(tmp) / "r" / "champion.json").read_text())
    return {"wall_s": wall, "generations_s": sum(t["seconds"] for t in timing),
            "kernel_s": sum(t.get("kernel_seconds", 0.0) + t.get("valid_kernel_seconds", 0.0)
                            for t in timing),
            "history": hist, "champion_tree": champ.get("tree")}


def run_section(before: Path | None, rounds: int, data: Path, args: list[str]) -> dict:
    sides = {"this": ROOT} | ({"before": before} if before else {})
    for path in sides.values():                    # warm each checkout's Numba cache
        one_run(path, data, SMOKE_RUN)
    got: dict = {k: [] for k in sides}
    for _ in range(rounds):
        for k, path in sides.items():
            got[k].append(one_run(path, data, args))
    out = {"command": "evolve run " + " ".join(args), "rounds": rounds}
    for k, rs in got.items():
        out[k] = {f: statistics.median(r[f] for r in rs)
                  for f in ("wall_s", "generations_s", "kernel_s")}
        out[k]["wall_s_all"] = [round(r["wall_s"], 3) for r in rs]
        out[k]["champion_tree"] = rs[0]["champion_tree"]
        out[k]["deterministic"] = all(r["history"] == rs[0]["history"] for r in rs)
    if before:
        a, b = got["this"][0], got["before"][0]
        out["before_dir"] = str(before)
        out["same_champion"] = a["champion_tree"] == b["champion_tree"]
        out["same_history"] = a["history"] == b["history"]
        for f in ("wall_s", "generations_s", "kernel_s"):
            out[f"speedup_{f}"] = out["before"][f] / out["this"][f]
    return out


def table(doc: dict) -> str:
    k = doc["kernel"]
    lines = [f"kernel: {k['trees']} trees, {k['nodes']:,} nodes; token train {k['token_rows']:,} "
             f"rows, trace train {k['trace_candidate_rows']:,} candidate rows"]
    for t in sorted({1, k["threads"]}):
        lines.append(f"  {t} thread(s): token {k[f'token_{t}t_node_evals_per_s'] / 1e9:.2f}e9, "
                     f"trace {k[f'trace_{t}t_node_evals_per_s'] / 1e9:.2f}e9 "
                     f"(with KL {k[f'trace_kl_{t}t_node_evals_per_s'] / 1e9:.2f}e9) node evals/s;"
                     f" trace/token {k[f'ratio_trace_vs_token_{t}t']:.2f}x; the per-candidate"
                     f" sums alone (constant programs) {100 * k[f'sums_share_{t}t']:.0f}% of "
                     "the trace kernel's time")
    lines.append(f"  {100 * k['row_level_node_share']:.0f}% of the nodes read per-position "
                 "inputs only (the same value for every candidate of a position)")
    r = doc.get("run")
    if r:
        lines.append(f"run: {r['command']} ({r['rounds']} rounds, medians)")
        for side in ("before", "this"):
            if side in r:
                s = r[side]
                lines.append(f"  {side:>6}: wall {s['wall_s']:.2f} s (all {s['wall_s_all']}), "
                             f"generations {s['generations_s']:.2f} s, kernel {s['kernel_s']:.2f}"
                             f" s; champion {s['champion_tree']}")
        if "before" in r:
            lines.append(f"  speed-up: wall {r['speedup_wall_s']:.2f}x, generations "
                         f"{r['speedup_generations_s']:.2f}x, kernel {r['speedup_kernel_s']:.2f}x;"
                         f" same history {r['same_history']}, same champion "
                         f"{r['same_champion']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, default=None, help="an older checkout to compare")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--data", type=Path, default=ROOT / "datasets")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CI)")
    ap.add_argument("--no-run", action="store_true", help="the kernel section only")
    a = ap.parse_args(argv)
    traces_dir = a.data / "traces"
    if a.smoke:
        a.trees, a.repeats, a.rounds = 20, 1, 1
    doc = {"kernel": kernel_section(a.trees, a.repeats, a.data, traces_dir)}
    if not a.no_run:
        doc["run"] = run_section(a.before.resolve() if a.before else None, a.rounds,
                                 traces_dir.resolve(), SMOKE_RUN if a.smoke else RUN)
    print(table(doc))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
