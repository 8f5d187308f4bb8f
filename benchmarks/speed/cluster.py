"""The cluster benchmark: one generation's train evaluation in-process against a
local Dask cluster, on sharded traces.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.cluster [--tokens 10000000] [--work DIR] [--population 1000]
                                 [--generations 2] [--workers 2] [--shards 2 8]
                                 [--json FILE] [--smoke] [--no-in-process]

1. builds (once; kept in ``--work``, not committed) a trace set with the n-gram
   pair whose train split has at least ``--tokens`` drafted tokens, written
   straight into 8 shards (``evolve data trace --rows-per-shard``), and the
   same train split re-sharded into the other ``--shards`` counts;
2. draws one population of ``--population`` random trees (the engine's
   initial-population generator, seed 0) and, each in its own process so its
   peak memory is its own, times ``--generations`` evaluations of it on train:
   ``in-process`` (every shard loaded in this process, all Numba threads) and
   ``local:W`` with each shard count (the driver holds no data; one pinned task
   per shard on the workers);
3. checks that every configuration returns the same sums, bit for bit, and
   prints a table (and JSON): seconds per generation, the slowest shard's kernel
   seconds, the communication and scheduling overhead per generation (wall time
   beyond the busiest worker's kernel time), and the peak RSS of the driver and
   of each worker.

``--smoke`` runs the same machinery on a tiny set (seconds).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, child_env, module_command  # noqa: E402

ROWS_PER_PROMPT = 16 * 4         # blocks_per_prompt x block_size of the default traces
BUILD_SHARDS = 8


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build(work: Path, tokens: int, smoke: bool, shard_counts) -> dict:
    """The sharded trace set (built once) and the train split in every shard count."""
    from evolve.data import shard_writer, shards
    prompts = max(2, math.ceil(tokens / ROWS_PER_PROMPT))
    rows = prompts * ROWS_PER_PROMPT
    base = work / f"tokens{rows}"
    built = base / f"shards{BUILD_SHARDS}"
    info = {"train_rows": rows, "train_prompts": prompts, "build_seconds": None}
    if not shards.is_sharded(built):
        cmd = [sys.executable, "-m", "evolve", "data", "trace", "--out", str(built),
               "--train-prompts", str(prompts), "--valid-prompts", "16", "--test-prompts", "16",
               "--rows-per-shard", str(math.ceil(rows / BUILD_SHARDS)), "--force"]
        if smoke:
            cmd += ["--max-files", "60", "--max-bytes-per-file", "40000"]
        t = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, env=child_env())
        info["build_seconds"] = time.perf_counter() - t
    for n in shard_counts:
        d = base / f"shards{n}"
        if n != BUILD_SHARDS and not shards.is_sharded(d):
            for s in ("train", "valid", "test"):
                shard_writer.reshard(shards.open_split(built / s, check=False), d / s,
                               math.ceil(len(shards.open_split(built / s, check=False)) / n))
    info["dirs"] = {n: str(base / f"shards{n}") for n in shard_counts}
    info["bytes_on_disk"] = sum(f.stat().st_size for f in (built / "train").rglob("*.npy"))
    return info


def population(n: int):
    """A random population as the engine's first one (half-and-half, heights 1..4,
    the trace primitives; seed 0), linearised."""
    from evolve.lang import primitives as P
    from evolve.lang import treeio
    from benchmarks.speed.sizes import random_trees
    return treeio.linearise([treeio.from_deap(t)
                             for t in random_trees(P.make_pset(trace=True), n, 1, 4, 0)])


def child(mode: str, data_dir: str, pop: int, generations: int, workers: int) -> dict:
    """One configuration, in its own process: seconds per generation, overhead, RSS."""
    from evolve.cluster.session import Session
    from evolve.data import shards
    progs = population(pop)
    split = shards.open_split(Path(data_dir) / "train", name="train", check=False)
    out = {"mode": mode, "shards": len(split.shards), "rows": len(split)}
    session = Session(cluster=f"local:{workers}" if mode != "in-process" else None)
    with session:
        t = time.perf_counter()
        cs = session.attach({"train": split})["train"]
        out["load_seconds"] = time.perf_counter() - t
        backend = cs.backend
        backend.sums(population(2), False)        # every process loads the kernel first
        backend.comm_seconds = 0.0
        times, sums = [], None
        for _ in range(generations):
            t = time.perf_counter()
            got = backend.sums(progs, False)
            times.append(time.perf_counter() - t)
            assert sums is None or np.array_equal(sums, got)
            sums = got
        out["seconds_per_generation"] = float(np.median(times))
        out["all_seconds"] = times
        out["node_evals_per_s"] = (float(progs.lengths.sum()) * len(split) * split.meta["top_k"]
                                   / out["seconds_per_generation"])
        if mode != "in-process":
            out["comm_seconds_per_generation"] = backend.comm_seconds / generations
            out["slowest_shard_seconds"] = max(backend.task_seconds)
            out["mean_shard_seconds"] = float(np.mean(backend.task_seconds))
            from evolve.cluster.worker import peak_rss_bytes
            rss = session.client.run(peak_rss_bytes)
            out["worker_peak_rss_mb"] = sorted(v / 2 ** 20 for v in rss.values())
        out["driver_peak_rss_mb"] = peak_rss_mb()
        out["sums_sha"] = __import__("hashlib").sha256(sums.tobytes()).hexdigest()[:16]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/evolve-cluster-bench"))
    ap.add_argument("--population", type=int, default=1000)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-in-process", action="store_true",
                    help="only the cluster configurations (the in-process one measured apart)")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.smoke:
        a.tokens, a.population, a.generations = 2_000, 50, 1
    if a.child:
        res = child(a.child[0], a.child[1], a.population, a.generations, a.workers)
        print(json.dumps(res))
        return 0
    info = build(a.work, a.tokens, a.smoke, sorted(set(a.shards) | {BUILD_SHARDS}))
    runs = [] if a.no_in_process else [("in-process", info["dirs"][BUILD_SHARDS])]
    runs += [(f"local:{a.workers}", info["dirs"][n]) for n in a.shards]
    results = []
    for mode, d in runs:
        cmd = [*module_command("benchmarks.speed.cluster"), "--child", mode, d, "--population", str(a.population),
               "--generations", str(a.generations), "--workers", str(a.workers)]
        p = subprocess.run(cmd, check=True, cwd=ROOT, env=child_env(), capture_output=True, text=True)
        results.append(json.loads(p.stdout.strip().splitlines()[-1]))
        r = results[-1]
        print(f"{mode:>11} {r['shards']:>2} shards: {r['seconds_per_generation']:8.2f} s/gen"
              f"  driver {r['driver_peak_rss_mb']:7.0f} MB"
              + (f"  workers {', '.join(f'{x:.0f}' for x in r['worker_peak_rss_mb'])} MB"
                 f"  comm {r['comm_seconds_per_generation']:.3f} s/gen"
                 f"  slowest shard {r['slowest_shard_seconds']:.2f} s"
                 if "worker_peak_rss_mb" in r else ""), flush=True)
    same = len({r["sums_sha"] for r in results}) == 1
    print(f"train: {info['train_rows']:,} drafted tokens, {info['bytes_on_disk'] / 1e9:.2f} GB "
          f"on disk; population {a.population}; sums identical in every configuration: {same}")
    doc = {"build": info, "population": a.population, "generations": a.generations,
           "workers": a.workers, "cpus": os.cpu_count(), "results": results,
           "identical_sums": same}
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
