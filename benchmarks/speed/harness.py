"""The speed benchmark: how fast the harness is, measured against the plain DEAP way.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.harness [--smoke] [--json] [--out FILE]

Sections, every figure a median over repeats on this machine:

1. population  The batched kernel (``evolve.kernels.tokens.population_counts``,
               all Numba threads) against DEAP's own evaluation (``gp.compile``
               of each tree to a Python function over the numpy primitives, one
               process, counts by ``metrics.counts_from_thresholds``) on one random
               population over the train split, in node evaluations per second
               (every node, leaves included, times rows). Both paths' counts are
               compared before any timing.
2. run         ``evolve run`` (100 generations x 1000) against
               ``benchmarks/speed/deap_reference.py`` (an eaSimple-style script with the
               same data, primitives, operators and limits); the share of each
               generation spent outside the kernels; peak and per-generation RSS.
3. champion    The generated Numba function of the run's champion and of every
               baseline over train (``scoring.score``: thresholds and counts).
4. startup     ``evolve --help`` and a warm ``evolve benchmark``.
5. cold start  A small ``evolve run`` from an empty Numba cache (a temporary
               ``NUMBA_CACHE_DIR``) to its first generation, and the same with
               the cache warm.
6. njit        Why not one ``numba.njit`` per tree: compile time per tree against
               the batched kernel's cost per individual.
7. operon      The population kernel against Operon's C++ SIMD interpreter
               (pyoperon, optional: skipped with a note when not installed) per node,
               on the same 1000 trees built by Operon's tree creator and converted,
               the same rows, one thread and two, after checking that values agree:
               an arithmetic mix and one where half the nodes are log/exp/sqrt
               (``benchmarks/speed/operon.py``).
8. trace       The trace kernel (every candidate row of the trace train split) against
               the token kernel per node on the same random population, one thread
               and all (``benchmarks/speed/trace_speed.py``, whose ``--before`` also times
               a trace run against an older checkout).

``--smoke`` runs the same machinery on tiny sizes (CI, tests/test_bench_speed.py); it
checks that both evaluation paths agree but no speed target. Heavy parts run in
subprocesses (``python -m benchmarks.speed.harness engine-child``, the reference script,
the CLI) so their memory is measured alone and nothing under runs/ or
heuristics/ is touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.common import ROOT, module_command  # noqa: E402

import numpy as np  # noqa: E402

from evolve.data import tokens as data  # noqa: E402
from evolve.lang import primitives as P  # noqa: E402
from evolve.lang import treeio  # noqa: E402
from evolve.objectives import metrics as F  # noqa: E402
from evolve.io import paths  # noqa: E402
from benchmarks.speed.sizes import FULL, SMOKE, Sizes, random_trees  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
FORMAT = "evolve-bench"
VERSION = 2


class BenchError(RuntimeError):
    """The benchmark could not measure what it claims (paths disagree, a step failed)."""


# name, section key path, comparison, target, unit
TARGETS = (
    ("kernel vs DEAP+numpy, population throughput", ("population", "ratio"), ">=", 4.0, "x"),
    ("evolve run vs DEAP reference, wall time", ("run", "ratio"), ">=", 10.0, "x"),
    ("peak RSS of the run", ("run", "cli", "peak_rss_mb"), "<", 500.0, "MB"),
    ("champion eval over train", ("champion", "champion", "eval_ms"), "<=", 0.2, "ms"),
    ("evolve --help", ("startup", "help_s"), "<", 0.5, "s"),
    ("evolve benchmark (warm)", ("startup", "benchmark_s"), "<", 3.0, "s"),
    ("per node vs Operon, arithmetic mix, 1 thread",
     ("operon", "mixes", "arith", "threads", "1", "ours_over_operon"), ">=", 1.0, "x"),
    ("per node vs Operon, arithmetic mix, 2 threads",
     ("operon", "mixes", "arith", "threads", "2", "ours_over_operon"), ">=", 1.0, "x"),
    ("per node vs Operon, half log/exp/sqrt, 1 thread",
     ("operon", "mixes", "transcendental", "threads", "1", "ours_over_operon"), ">=", 1.0, "x"),
    ("per node vs Operon, half log/exp/sqrt, 2 threads",
     ("operon", "mixes", "transcendental", "threads", "2", "ours_over_operon"), ">=", 1.0, "x"),
    ("trace kernel vs token kernel per node, 1 thread",
     ("trace", "ratio_trace_vs_token_1t"), ">=", 1.0, "x"),
)


def default_path(smoke: bool) -> Path:
    return BENCH_DIR / ("results-smoke.json" if smoke else "results.json")


# ------------------------------------------------------------------ helpers

def _median(xs) -> float:
    return float(statistics.median(xs))


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _subset(ds: data.Dataset, rows: int | None) -> data.Dataset:
    """The first ``rows`` rows of a split (all of it for None)."""
    if rows is None or rows >= len(ds):
        return ds
    cols = {f: np.ascontiguousarray(v[:rows]) for f, v in ds.columns().items()}
    return data.Dataset(**cols, name=ds.name)


def numpy_columns(ds: data.Dataset) -> tuple:
    """The primitive set's inputs, in order, as it types them: integer columns
    (position) as floats, the values the kernel's feature matrix holds; bool
    columns (top_token_match) stay bool."""
    cols = []
    for name in P.INPUT_NAMES:
        col = getattr(ds, name)
        cols.append(col.astype(np.float64) if np.issubdtype(col.dtype, np.integer) else col)
    return tuple(cols)


def machine() -> dict:
    import deap
    import llvmlite
    import numba
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    from importlib.metadata import PackageNotFoundError, version
    try:
        ours = version("specevolve")
    except PackageNotFoundError:
        ours = None
    commit = None
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        pass
    return {
        "cpu_model": cpu,
        "logical_cpus": os.cpu_count(),
        "numba_threads": numba.get_num_threads(),
        "platform": platform.platform(),
        "versions": {"python": platform.python_version(), "numpy": np.__version__,
                     "numba": numba.__version__, "llvmlite": llvmlite.__version__,
                     "deap": getattr(deap, "__version__", None), "specevolve": ours},
        "git_commit": commit,
    }


# ---------------------------------------------------- section 1: population

def _numpy_counts(tree, pset, cols, ds, std) -> tuple[F.Counts, float, float]:
    """DEAP's way for one tree: compile, evaluate on arrays, count. (counts,
    compile seconds, evaluate+count seconds)."""
    from deap import gp
    t0 = time.perf_counter()
    func = gp.compile(tree, pset)
    t1 = time.perf_counter()
    h = np.broadcast_to(np.asarray(func(*cols), dtype=np.float64), (len(ds),))
    c = F.counts_from_thresholds(h, ds.rand_value, ds.baseline_accepts, std)
    return c, t1 - t0, time.perf_counter() - t1


def check_counts(trees, kernel_rows, numpy_counts) -> dict:
    """Both paths must give the same counts for every tree (the numpy meanings of the
    primitive table give the kernel's bits, exp and log included: they are
    heuristics.ops' own); any difference raises BenchError."""
    n = int(numpy_counts[0].n) if numpy_counts else 0
    mismatched = [str(trees[i]) for i, (row, c) in enumerate(zip(kernel_rows, numpy_counts))
                  if F.Counts.from_raw(n, row) != c]
    if mismatched:
        raise BenchError(f"kernel and DEAP/numpy counts differ on {len(mismatched)} tree(s), "
                         f"first: {mismatched[0]}")
    return {
        "trees": len(trees),
        "identical": len(trees),
        "all_equal": True,
        "note": ("counts compared row by row (3 decision counts, 3 fixed-point expected "
                 "sums)"),
    }


def _kernel_path(trees, split) -> tuple[np.ndarray, float, float]:
    """(rows, convert seconds, kernel seconds) from DEAP trees."""
    from evolve.kernels.tokens import population_counts
    t0 = time.perf_counter()
    progs = treeio.linearise([treeio.from_deap(t) for t in trees])
    t1 = time.perf_counter()
    rows = population_counts(progs, split)
    return rows, t1 - t0, time.perf_counter() - t1


def _numpy_path(trees, pset, cols, ds, std) -> tuple[list, float, float, float]:
    """(counts, wall, compile seconds, evaluate+count seconds) of the DEAP way."""
    out, comp, ev = [], 0.0, 0.0
    t0 = time.perf_counter()
    for t in trees:
        c, a, b = _numpy_counts(t, pset, cols, ds, std)
        out.append(c)
        comp += a
        ev += b
    return out, time.perf_counter() - t0, comp, ev


def population_section(sizes: Sizes, train: data.Dataset, note) -> dict:
    import numba

    from evolve.kernels.tokens import TokenArrays, population_counts
    pset = P.make_pset()
    trees = random_trees(pset, sizes.pop_size, sizes.pop_min_height, sizes.pop_max_height,
                          sizes.pop_seed)
    n = len(train)
    nodes = sum(len(t) for t in trees)
    node_evals = nodes * n
    split = TokenArrays(train)
    cols = numpy_columns(train)
    std = train.standard_threshold()

    note(f"population: {len(trees)} trees, {nodes:,} nodes, {n:,} rows; checking both paths")
    rows, _, _ = _kernel_path(trees, split)            # also compiles / loads the cache
    np_counts = _numpy_path(trees, pset, cols, train, std)[0]
    check = check_counts(trees, rows, np_counts)

    kern, conv, kern_only, nump, comp, evl = [], [], [], [], [], []
    for r in range(sizes.repeats):
        note(f"population: timing round {r + 1}/{sizes.repeats}")
        rows2, a, b = _kernel_path(trees, split)
        if not np.array_equal(rows2, rows):
            raise BenchError("kernel counts changed between repeats")
        kern.append(a + b)
        conv.append(a)
        kern_only.append(b)
        _, wall, c, e = _numpy_path(trees, pset, cols, train, std)
        nump.append(wall)
        comp.append(c)
        evl.append(e)

    # The kernel on one thread, for a per-core comparison.
    threads = numba.get_num_threads()
    progs = treeio.linearise([treeio.from_deap(t) for t in trees])
    one = []
    numba.set_num_threads(1)
    try:
        for _ in range(max(1, min(3, sizes.repeats))):
            t0 = time.perf_counter()
            population_counts(progs, split)
            one.append(time.perf_counter() - t0)
    finally:
        numba.set_num_threads(threads)

    k_wall, k_only, n_wall, n_eval = _median(kern), _median(kern_only), _median(nump), _median(evl)
    return {
        "trees": len(trees),
        "heights": [sizes.pop_min_height, sizes.pop_max_height],
        "seed": sizes.pop_seed,
        "nodes": nodes,
        "mean_size": nodes / len(trees),
        "rows": n,
        "node_evals": node_evals,
        "repeats": sizes.repeats,
        "counts_check": check,
        "kernel": {
            "threads": threads,
            "wall_s": k_wall,
            "convert_s": _median(conv),
            "kernel_s": k_only,
            "node_evals_per_s": node_evals / k_wall,
            "kernel_node_evals_per_s": node_evals / k_only,
            "per_individual_ms": k_only / len(trees) * 1e3,
            "one_thread_kernel_s": _median(one),
            "one_thread_node_evals_per_s": node_evals / _median(one),
            "all_wall_s": kern,
        },
        "numpy": {
            "processes": 1,
            "wall_s": n_wall,
            "compile_s": _median(comp),
            "eval_s": n_eval,
            "node_evals_per_s": node_evals / n_wall,
            "eval_node_evals_per_s": node_evals / n_eval,
            "all_wall_s": nump,
        },
        # from DEAP trees to counts, both ways (kernel: linearise + kernel;
        # DEAP: gp.compile + numpy + counting)
        "ratio": n_wall / k_wall,
        # evaluation only (kernel alone vs numpy evaluation + counting)
        "ratio_eval_only": n_eval / k_only,
        "ratio_per_core": (n_eval / _median(one)),
        # fastest round of each path (the machine is shared; noise only slows)
        "ratio_best": min(nump) / min(kern),
    }


# -------------------------------------------------------- subprocess helper

@dataclass
class Measured:
    rc: int
    wall_s: float
    peak_rss_mb: float | None   # highest VmHWM seen while polling (None: too short to poll)
    rss_samples_mb: list        # VmRSS polled every POLL_S
    stdout: str
    stderr: str


POLL_S = 0.05


def _proc_status_mb(pid: int, keys=("VmRSS:", "VmHWM:")) -> dict:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                for k in keys:
                    if line.startswith(k):
                        out[k] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


def run_measured(cmd: list[str], timeout: float, cwd: Path | None = None,
                 env: dict | None = None) -> Measured:
    """Run a command: wall time, peak RSS and an RSS time series.

    Peak RSS is the process's own high-water mark (VmHWM), polled: wait4's and
    getrusage's ru_maxrss are not usable for a child on Linux, as they count the
    parent's memory the child had between fork and exec.
    """
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=cwd, env=env)
        samples: list[float] = []
        hwm: list[float] = []
        done = threading.Event()

        def poll():
            while not done.wait(POLL_S):
                st = _proc_status_mb(proc.pid)
                if "VmRSS:" in st:
                    samples.append(st["VmRSS:"])
                if "VmHWM:" in st:
                    hwm.append(st["VmHWM:"])
        th = threading.Thread(target=poll, daemon=True)
        th.start()
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        _, status = os.waitpid(proc.pid, 0)
        wall = time.perf_counter() - t0
        killer.cancel()
        done.set()
        th.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(proc.returncode, wall, max(hwm) if hwm else None, samples,
                        out.read(), err.read())


def peak_rss_self_mb() -> float:
    """This process's own high-water RSS (VmHWM; see run_measured)."""
    return _proc_status_mb(os.getpid(), ("VmHWM:",)).get("VmHWM:", 0.0)


def _child_env() -> dict:
    env = dict(os.environ)
    env.pop(paths.RUNS_ENV, None)
    # the children import this checkout's evolve, as this process does
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]]
                                                       if env.get("PYTHONPATH") else []))
    env.setdefault("NO_COLOR", "1")
    env.setdefault("COLUMNS", "160")
    return env


def _self_cmd(*args: str) -> list[str]:
    """This script in a fresh interpreter."""
    return module_command("benchmarks.speed.harness", *args)


def _evolve_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "evolve"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("evolve")
    return [found] if found else [sys.executable, "-m", "evolve"]


def _parse_json(text: str, what: str):
    try:
        return json.loads(text)
    except ValueError as e:
        raise BenchError(f"{what}: stdout is not one JSON document ({e})") from None


def _checked(m: Measured, what: str) -> Measured:
    if m.rc != 0:
        tail = " | ".join(m.stderr.strip().splitlines()[-3:])
        raise BenchError(f"{what} exited with {m.rc}: {tail}")
    return m


# ---------------------------------------------------------- section 2: run

def _engine_child(spec: dict) -> dict:
    """One in-process Evolution with per-generation timing and RSS (run as
    ``python -m benchmarks.speed.harness engine-child SPEC``)."""
    from evolve.search.config import Config
    from evolve.search.engine import Evolution
    from evolve.search.operators import fewer_collections
    t_start = time.perf_counter()
    train = data.load_split(spec["data"], "train")
    valid = data.load_split(spec["data"], "valid")
    cfg = Config(generations=spec["generations"], population=spec["population"],
                 seed=spec["seed"])
    # Load the kernels of a run from Numba's cache first, with a two-generation
    # run on a few rows, so the generations time their work, not the one-off
    # load (the CLI figures include it).
    warm = Evolution(Config(generations=2, population=16, seed=0),
                     _subset(train, 64), _subset(valid, 64))
    with fewer_collections():
        warm.initialise()
        warm.step()
        warm.step()
    t_loop = time.perf_counter()
    ev = Evolution(cfg, train, valid)
    gens = []

    def record(rec):
        t = rec["timing"]
        p = t["parts"]
        # the engine's own stage timings, less the kernels they contain
        outside = {
            "selection": p["selection"],
            "variation (varAnd, limits, cloning, elites)": p["variation"],
            "evaluation outside the kernel (fitness cache, kernel programs)":
                p["evaluation"] - t["kernel_seconds"],
            "hall of fame and valid scores outside the kernel":
                p["hall_of_fame"] - t["valid_kernel_seconds"],
        }
        gens.append({"generation": rec["generation"], "evaluated": rec["evaluated"],
                     "unique": rec["unique"], "seconds": t["seconds"],
                     "kernel_seconds": t["kernel_seconds"],
                     "valid_kernel_seconds": t["valid_kernel_seconds"],
                     "parts": outside,
                     "best_train": rec["best_train"], "mean_size": rec["mean_size"],
                     "rss_mb": _rss_mb()})

    with fewer_collections():     # as `evolve run` does
        record(ev.initialise())
        while ev.generation < cfg.generations:
            record(ev.step())
    loop_s = time.perf_counter() - t_loop
    champ = ev.champion()
    return {"loop_seconds": loop_s, "setup_seconds": t_loop - t_start,
            "per_generation": gens,
            "peak_rss_mb": peak_rss_self_mb(),
            "champion": {"tree": champ.tree, "size": champ.size, "train_fitness": champ.fitness},
            "kernel_programs": ev.train.kernel_programs, "node_evals": ev.train.node_evals}


def _rss_flatness(per_gen: list[dict]) -> dict:
    rss = [g["rss_mb"] for g in per_gen]
    k = min(10, len(rss) - 1)
    growth = max(rss[k:]) - rss[k]
    return {"after_generation": k, "rss_at_mb": rss[k], "max_after_mb": max(rss[k:]),
            "last_mb": rss[-1], "growth_mb": growth,
            "flat": bool(growth <= max(10.0, 0.05 * rss[k]))}


def run_section(sizes: Sizes, data_dir: Path, note, workdir: Path) -> dict:
    G, Pn, S = sizes.run_generations, sizes.run_population, sizes.run_seed
    env = _child_env()
    budget = 900 if sizes is FULL else 300

    note(f"run: Evolution in a child process ({G} generations x {Pn})")
    spec = {"data": str(data_dir), "generations": G, "population": Pn, "seed": S}
    m = _checked(run_measured(_self_cmd("engine-child", json.dumps(spec)), budget, cwd=ROOT,
                              env=env), "engine child")
    eng = _parse_json(m.stdout, "engine child")
    per = eng["per_generation"]
    steps = per[1:] or per          # generations after the initial population
    secs = sum(g["seconds"] for g in steps)
    ktrain = sum(g["kernel_seconds"] for g in steps)
    kvalid = sum(g["valid_kernel_seconds"] for g in steps)
    all_secs = sum(g["seconds"] for g in per)
    all_kernel = sum(g["kernel_seconds"] + g["valid_kernel_seconds"] for g in per)
    fractions = [1.0 - (g["kernel_seconds"] + g["valid_kernel_seconds"]) / g["seconds"]
                 for g in steps if g["seconds"] > 0]
    names = sorted({k for g in steps for k in g["parts"]})
    breakdown = {k: sum(g["parts"].get(k, 0.0) for g in steps) for k in names}
    outside = secs - ktrain - kvalid
    breakdown["other (history record, statistics)"] = outside - sum(breakdown.values())
    engine = {
        "process_wall_s": m.wall_s, "loop_s": eng["loop_seconds"],
        "outside_kernels_s": {k: round(v, 4) for k, v in breakdown.items()},
        "setup_s": eng["setup_seconds"], "peak_rss_mb": eng["peak_rss_mb"],
        "generation_s_median": _median([g["seconds"] for g in per[1:]] or [0.0]),
        "evaluated": sum(g["evaluated"] for g in per),
        "unique_evaluated": sum(g["unique"] for g in per),
        "kernel_programs": eng["kernel_programs"],
        "champion": eng["champion"],
        "rss": _rss_flatness(per),
        "rss_per_generation_mb": [round(g["rss_mb"], 1) for g in per],
    }

    note("run: evolve run (CLI) with a temporary --runs-dir and --no-writeback")
    runs_tmp = workdir / "runs"
    cmd = _evolve_cmd() + ["run", "--generations", str(G), "--population", str(Pn),
                           "--seed", str(S), "--no-writeback", "--runs-dir", str(runs_tmp),
                           "--data", str(data_dir), "--json"]
    cm = _checked(run_measured(cmd, budget, cwd=ROOT, env=env), "evolve run")
    cli_out = _parse_json(cm.stdout, "evolve run --json")
    cli = {"command": "evolve " + " ".join(cmd[len(_evolve_cmd()):]).replace(str(runs_tmp),
                                                                             "<tmp>/runs"),
           "wall_s": cm.wall_s, "peak_rss_mb": cm.peak_rss_mb,
           "peak_rss_note": f"VmHWM polled every {POLL_S} s",
           "rss_samples": len(cm.rss_samples_mb),
           "rss_polled_max_mb": max(cm.rss_samples_mb) if cm.rss_samples_mb else None,
           "champion": (cli_out.get("champion") or {}).get("tree")
           if isinstance(cli_out, dict) else None}

    note("run: DEAP reference (benchmarks/speed/deap_reference.py), numpy evaluation")
    rm = _checked(run_measured([*module_command("benchmarks.speed.deap_reference"), "--generations", str(G),
                                "--population", str(Pn), "--seed", str(S), "--data",
                                str(data_dir)], budget * 3, cwd=ROOT, env=env),
                  "deap_reference.py")
    ref = _parse_json(rm.stdout, "deap_reference.py")
    rper = ref["per_generation"]
    same = [a["best_train"] for a in per] == [b["best_train"] for b in rper]
    reference = {
        "process_wall_s": rm.wall_s, "loop_s": ref["loop_seconds"],
        "peak_rss_mb": ref["peak_rss_mb"], "evaluations": ref["evaluations"],
        "generation_s_median": _median([g["seconds"] for g in rper[1:]] or [0.0]),
        "eval_fraction": sum(g["eval_seconds"] for g in rper) / sum(g["seconds"] for g in rper),
        "champion": ref["champion"], "rss": _rss_flatness(rper),
    }
    return {
        "generations": G, "population": Pn, "seed": S,
        "engine": engine, "cli": cli, "reference": reference,
        "same_best_fitness_every_generation": same,
        # process to process: `evolve run` (start-up, checkpoints, champion) vs the script
        "ratio": rm.wall_s / cm.wall_s,
        # evolution loops only (no start-up, data loading or final reports)
        "ratio_loop": ref["loop_seconds"] / eng["loop_seconds"],
        # share of generation time outside the train and valid kernels, over the
        # generations after the initial population (the steady state)
        "overhead_fraction": 1.0 - (ktrain + kvalid) / secs if secs > 0 else 0.0,
        "overhead_fraction_median_generation": _median(fractions) if fractions else 0.0,
        "overhead_fraction_with_initial": 1.0 - all_kernel / all_secs if all_secs > 0 else 0.0,
        "generation_seconds": {"kernel_train": ktrain, "kernel_valid": kvalid, "total": secs,
                               "outside_kernels": secs - ktrain - kvalid},
    }


# ----------------------------------------------------- section 3: champion

def champion_section(sizes: Sizes, train: data.Dataset, tree: str | None, workdir: Path,
                     note) -> dict:
    import importlib.util

    from evolve.lang import codegen
    from evolve.runs.scoring import PreparedSplit, score
    from heuristics import registry
    ps = PreparedSplit(train)
    out: dict = {"rows": ps.n, "repeats": sizes.champion_repeats}
    if tree:
        note("champion: generated module of the run's champion")
        nodes = treeio.parse(tree)
        src = codegen.module_source(nodes, "evolved", {"run": "bench", "tree": tree},
                                    "benchmarks/speed/harness.py champion")
        path = workdir / "bench_champion.py"
        path.write_text(src, encoding="utf-8")
        spec = importlib.util.spec_from_file_location("bench_champion", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ufunc = registry.compile_function(mod.evolved)
        m = score(ufunc, ps, sizes.champion_repeats)
        out["champion"] = {"tree": tree, "size": len(nodes), "eval_ms": m["eval_ms"],
                           "fitness": m["fitness"]}
    note("champion: baselines and heuristics/evolved.py")
    out["heuristics"] = {}
    for name in registry.names():
        m = score(registry.compiled(name), ps, sizes.champion_repeats)
        out["heuristics"][name] = {"eval_ms": m["eval_ms"], "fitness": m["fitness"]}
    return out


# ------------------------------------------------------ section 4: startup

def startup_section(sizes: Sizes, data_dir: Path, note) -> dict:
    env = _child_env()
    evolve = _evolve_cmd()
    note(f"startup: evolve --help x{sizes.help_repeats}")
    _checked(run_measured(evolve + ["--help"], 60, cwd=ROOT, env=env), "evolve --help")
    helps = [_checked(run_measured(evolve + ["--help"], 60, cwd=ROOT, env=env),
                      "evolve --help").wall_s for _ in range(sizes.help_repeats)]
    bench_cmd = evolve + ["benchmark", "--data", str(data_dir)]
    note("startup: evolve benchmark (first run warms the numba cache)")
    first = _checked(run_measured(bench_cmd, 600, cwd=ROOT, env=env), "evolve benchmark").wall_s
    warm = [_checked(run_measured(bench_cmd, 300, cwd=ROOT, env=env), "evolve benchmark").wall_s
            for _ in range(sizes.benchmark_repeats)]
    return {"help_s": _median(helps), "help_all_s": helps, "benchmark_first_s": first,
            "benchmark_s": _median(warm), "benchmark_all_s": warm,
            "benchmark_command": "evolve benchmark" + ("" if data_dir == paths.DATA_DIR
                                                       else " --data <smoke subset>")}


# ---------------------------------------------------- section 5: cold start

FIRST_GENERATION = "gen 0/"     # evolve run's progress line for generation 0 (stderr)


def time_to_first_generation(cmd: list[str], env: dict, timeout: float) -> dict:
    """Start ``evolve run`` (not --json: its plain progress lines on stderr) and
    time it until it reports generation 0; then kill it (what follows is the
    run, not the start). Raises BenchError if it ends or times out first."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env=env)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    first, tail = None, []
    try:
        for line in proc.stderr:
            if line.startswith(FIRST_GENERATION):
                first = time.perf_counter() - t0
                break
            tail = (tail + [line.rstrip()])[-3:]
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
        rc = proc.wait()
    if first is None:
        raise BenchError(f"evolve run (cold start) ended (exit {rc}) before its first "
                         f"generation: {' | '.join(tail)}")
    return {"first_generation_s": first}


def cold_start_section(sizes: Sizes, data_dir: Path, note, workdir: Path) -> dict:
    """A small `evolve run` to its first generation, from an empty Numba cache
    (a temporary NUMBA_CACHE_DIR: every kernel compiled) and with the cache warm."""
    env = _child_env()
    Pn = sizes.cold_population
    cmd = _evolve_cmd() + ["run", "--generations", "1", "--population", str(Pn), "--seed",
                           str(sizes.run_seed), "--no-writeback", "--runs-dir",
                           str(workdir / "cold-runs"), "--data", str(data_dir)]
    cache = workdir / "numba-cache"
    note(f"cold start: evolve run (population {Pn}) from an empty numba cache to generation 0")
    cold_env = dict(env, NUMBA_CACHE_DIR=str(cache))
    cold = time_to_first_generation(cmd, cold_env, 900)["first_generation_s"]
    compiled = sorted(p.name for p in cache.rglob("*.nbi"))
    shutil.rmtree(cache, ignore_errors=True)
    note("cold start: the same with the numba cache warm")
    warm = time_to_first_generation(cmd, env, 300)["first_generation_s"]
    return {"cold_s": cold, "warm_s": warm, "population": Pn,
            "functions_compiled": len(compiled), "cache_index_files": compiled,
            "command": "evolve " + " ".join(cmd[len(_evolve_cmd()):]).replace(
                str(workdir), "<tmp>"),
            "note": "seconds from starting the process to its progress line for generation "
                    "0 (initial population evaluated on train, hall of fame scored on "
                    "valid); cold: NUMBA_CACHE_DIR pointed at an empty directory, so every "
                    "kernel is compiled"}


# --------------------------------------------------------- section 6: njit

def njit_section(sizes: Sizes, per_individual_ms: float, note) -> dict:
    import numba

    from evolve.lang import codegen
    from heuristics import ops as O
    pset = P.make_pset()
    trees = random_trees(pset, sizes.njit_trees, sizes.pop_min_height, sizes.pop_max_height,
                          sizes.njit_seed, distinct=True)
    note(f"njit: compiling {len(trees)} distinct trees, one numba.njit each")
    times = []
    args = (0.3, 0.4, 5, 1.2, 2.3, True)       # the reference signature's types
    for i, t in enumerate(trees):
        nodes = treeio.from_deap(t)
        src = (f"def heuristic({', '.join(P.INPUT_NAMES)}):\n"
               f"    return {codegen.expression(nodes)}\n")
        ns = {name: getattr(O, name) for name in codegen.helpers_used(nodes)}
        exec(compile(src, f"<bench tree {i}>", "exec"), ns)   # noqa: S102 - our own codegen
        fn = numba.njit(cache=False)(ns["heuristic"])
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    med = _median(times) * 1e3
    return {"trees": len(trees), "compile_ms_median": med,
            "compile_ms_mean": float(np.mean(times)) * 1e3,
            "compile_ms_min": min(times) * 1e3, "compile_ms_max": max(times) * 1e3,
            "kernel_per_individual_ms": per_individual_ms,
            "ratio": med / per_individual_ms if per_individual_ms > 0 else None,
            "note": "first call of numba.njit (no cache) of each tree's generated function, "
                    "against the batched kernel's time per individual over the whole split"}


# ---------------------------------------------------------------- driver

def operon_section(sizes: Sizes, smoke: bool, note) -> dict:
    """Section 7 (``benchmarks/speed/operon.py``): skipped, with the reason, without pyoperon."""
    from benchmarks.speed import operon as op
    try:
        import pyoperon  # noqa: F401
    except ImportError:
        note(op.SKIP)
        return {"skipped": op.SKIP}
    note("operon: building, converting and checking trees, then timing")
    try:
        if smoke:
            return op.measure(trees=20, repeats=1, rows=2000, judge=False)
        return op.measure(trees=sizes.pop_size, repeats=sizes.repeats)
    except op.Disagreement as e:
        raise BenchError(f"operon: {e}") from None


def trace_section(sizes: Sizes, data_dir: Path, smoke: bool, note, workdir: Path) -> dict:
    """Section 8 (``benchmarks/speed/trace_speed.py``'s kernel section) on the default traces
    (built into the work directory when datasets/traces has none; tiny with --smoke)."""
    from benchmarks.speed import trace_speed as ts
    trace_dir = paths.DATA_DIR / "traces"
    if smoke or not (trace_dir / "train.npz").exists():
        trace_dir = workdir / "traces"
        args = ["data", "trace", "--out", str(trace_dir)]
        if smoke:
            args += ["--train-prompts", "16", "--valid-prompts", "8", "--test-prompts", "8",
                     "--max-files", "4", "--max-bytes-per-file", "20000"]
        note(f"trace: building traces in {trace_dir}")
        _checked(run_measured(_evolve_cmd() + args, timeout=600), "evolve data trace")
    note("trace: token and trace kernels on one population")
    return ts.kernel_section(sizes.pop_size, sizes.repeats, data_dir, trace_dir)


def _dig(d: dict, path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _targets(result: dict, checked: bool) -> list[dict]:
    ops = {">=": lambda a, b: a >= b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b}
    out = []
    for name, path, op, target, unit in TARGETS:
        v = _dig(result, path)
        met = None if (v is None or not checked) else bool(ops[op](v, target))
        out.append({"name": name, "key": ".".join(path), "value": v, "op": op,
                    "target": target, "unit": unit, "met": met})
    return out


def _write_smoke_data(directory: Path, rows: int) -> None:
    for split in data.SPLITS:
        ds = _subset(data.load_split(paths.DATA_DIR, split), rows)
        data.save_npz(ds, data.split_path(directory, split))


def run(smoke: bool = False, note=lambda s: None) -> dict:
    """Every section; returns the JSON-ready result."""
    sizes = SMOKE if smoke else FULL
    t0 = time.perf_counter()
    result: dict = {"format": FORMAT, "version": VERSION, "mode": "smoke" if smoke else "full",
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "machine": machine(), "sizes": asdict(sizes)}
    with tempfile.TemporaryDirectory(prefix="evolve-bench-") as tmp:
        work = Path(tmp)
        if smoke:
            data_dir = work / "data"
            _write_smoke_data(data_dir, sizes.rows)
        else:
            data_dir = paths.DATA_DIR
        train = data.load_split(data_dir, "train")
        result["data"] = {"dir": "datasets/" if not smoke else "<first rows of datasets/>",
                          "train_rows": len(train)}
        result["population"] = population_section(sizes, train, note)
        result["run"] = run_section(sizes, data_dir, note, work)
        champ_tree = result["run"]["engine"]["champion"]["tree"]
        result["champion"] = champion_section(sizes, train, champ_tree, work, note)
        result["startup"] = startup_section(sizes, data_dir, note)
        result["cold_start"] = cold_start_section(sizes, data_dir, note, work)
        result["njit"] = njit_section(sizes, result["population"]["kernel"]["per_individual_ms"],
                                      note)
        result["operon"] = operon_section(sizes, smoke, note)
        result["trace"] = trace_section(sizes, data_dir, smoke, note, work)
    result["targets"] = _targets(result, checked=not smoke)
    result["wall_s"] = time.perf_counter() - t0
    return _finite(result)


def _finite(obj):
    """JSON-safe: non-finite floats become None."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, (float, np.floating)):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def save(result: dict, path: Path) -> None:
    from evolve.io.atomic import atomic_write_json
    atomic_write_json(path, result)


# ----------------------------------------------------------------- display

def _g(x: float) -> str:
    return f"{x / 1e9:.2f}e9"


def table_rows(r: dict) -> list[list[str]]:
    """(section, figure, value) rows of the result, all measured numbers."""
    pop, run_, ch, st, nj = (r["population"], r["run"], r["champion"], r["startup"], r["njit"])
    cs = r["cold_start"]
    k, npy, cc = pop["kernel"], pop["numpy"], pop["counts_check"]
    eng, cli, ref = run_["engine"], run_["cli"], run_["reference"]
    rows = [
        ["population", "trees / nodes / rows",
         f"{pop['trees']} / {pop['nodes']:,} (mean {pop['mean_size']:.1f}) / {pop['rows']:,}"],
        ["population", "counts identical (kernel vs DEAP+numpy)",
         f"{cc['identical']}/{cc['trees']}"],
        ["population", f"kernel, {k['threads']} threads: wall (linearise + kernel)",
         f"{k['wall_s'] * 1e3:.1f} ms = {_g(k['node_evals_per_s'])} node evals/s"],
        ["population", "kernel alone", f"{k['kernel_s'] * 1e3:.1f} ms = "
                                       f"{_g(k['kernel_node_evals_per_s'])} node evals/s"],
        ["population", "kernel alone, 1 thread", f"{k['one_thread_kernel_s'] * 1e3:.1f} ms = "
                                                 f"{_g(k['one_thread_node_evals_per_s'])}/s"],
        ["population", "DEAP gp.compile + numpy + counts, 1 process",
         f"{npy['wall_s'] * 1e3:.0f} ms = {_g(npy['node_evals_per_s'])} node evals/s "
         f"(compile {npy['compile_s'] * 1e3:.0f} ms)"],
        ["population", "ratio (DEAP trees to counts)", f"{pop['ratio']:.1f}x"],
        ["population", "ratio, evaluation only / per core / fastest rounds",
         f"{pop['ratio_eval_only']:.1f}x / {pop['ratio_per_core']:.1f}x / "
         f"{pop['ratio_best']:.1f}x"],
        ["run", f"evolve run {run_['generations']} gen x {run_['population']} (CLI process)",
         f"{cli['wall_s']:.1f} s"],
        ["run", "DEAP reference script (process)",
         f"{ref['process_wall_s']:.1f} s ({ref['evaluations']:,} evaluations)"],
        ["run", "ratio (process) / (loops only)",
         f"{run_['ratio']:.1f}x / {run_['ratio_loop']:.1f}x "
         f"({eng['loop_s']:.1f} s vs {ref['loop_s']:.1f} s)"],
        ["run", "same best fitness every generation",
         str(run_["same_best_fitness_every_generation"])],
        ["run", "median generation: engine / reference",
         f"{eng['generation_s_median'] * 1e3:.1f} ms / {ref['generation_s_median'] * 1e3:.0f} ms"],
        ["run", "time outside the kernels, generations 1.. (total / median)",
         f"{100 * run_['overhead_fraction']:.0f}% / "
         f"{100 * run_['overhead_fraction_median_generation']:.0f}%"],
    ]
    for name, v in eng["outside_kernels_s"].items():
        rows.append(["run", f"  outside the kernels: {name}",
                     f"{v / max(1, run_['generations']) * 1e3:.1f} ms per generation"])
    rows += [
        ["run", "peak RSS: evolve run / engine child / reference",
         f"{cli['peak_rss_mb']:.0f} / {eng['peak_rss_mb']:.0f} / {ref['peak_rss_mb']:.0f} MB"],
        ["run", f"RSS from generation {eng['rss']['after_generation']} to the end",
         f"{eng['rss']['rss_at_mb']:.0f} -> max {eng['rss']['max_after_mb']:.0f} MB "
         f"(+{eng['rss']['growth_mb']:.1f}; flat: {eng['rss']['flat']})"],
    ]
    if "champion" in ch:
        c = ch["champion"]
        rows.append(["champion", f"run champion (size {c['size']}) over {ch['rows']:,} rows",
                     f"{c['eval_ms']:.3f} ms"])
    for name, m in ch["heuristics"].items():
        rows.append(["champion", name, f"{m['eval_ms']:.3f} ms"])
    rows += [
        ["startup", "evolve --help", f"{st['help_s']:.2f} s"],
        ["startup", "evolve benchmark (warm cache; first run)",
         f"{st['benchmark_s']:.2f} s ({st['benchmark_first_s']:.2f} s)"],
        ["cold start", f"evolve run (population {cs['population']}) to generation 0, "
                       "empty numba cache",
         f"{cs['cold_s']:.1f} s ({cs['functions_compiled']} functions compiled)"],
        ["cold start", "the same, numba cache warm", f"{cs['warm_s']:.2f} s"],
        ["njit", f"numba.njit compile per tree ({nj['trees']} trees, median)",
         f"{nj['compile_ms_median']:.0f} ms (min {nj['compile_ms_min']:.0f}, "
         f"max {nj['compile_ms_max']:.0f})"],
        ["njit", "batched kernel per individual", f"{nj['kernel_per_individual_ms']:.3f} ms"],
        ["njit", "ratio", f"{nj['ratio']:.0f}x" if nj["ratio"] else "n/a"],
    ]
    op = r.get("operon") or {}
    if "skipped" in op:
        rows.append(["operon", "Operon reference", op["skipped"]])
    for mix, m in op.get("mixes", {}).items():
        c = m["check"]
        rows.append(["operon", f"{mix}: trees / nodes / log+exp+sqrt",
                     f"{op['trees']} / {m['nodes']:,} / {100 * m['transcendental_share']:.0f}%"])
        rows.append(["operon", f"{mix}: values agree",
                     f"{c['trees_agree']}/{c['trees_compared']} trees, "
                     f"{100 * c['rows_agree_share']:.4f}% of rows"])
        for t, x in m["threads"].items():
            rows.append(["operon", f"{mix}, {t} thread(s): ours vs Operon",
                         f"{_g(x['ours_node_evals_per_s'])} vs {_g(x['operon_node_evals_per_s'])}"
                         f" = {x['ours_over_operon']:.2f}x"])
    tr = r.get("trace") or {}
    if tr:
        rows.append(["trace", "trees / nodes; rows (token rows)",
                     f"{tr['trees']} / {tr['nodes']:,}; {tr['trace_candidate_rows']:,} "
                     f"({tr['token_rows']:,})"])
        for t in sorted({1, tr["threads"]}):
            rows.append(["trace", f"{t} thread(s): trace vs token kernel",
                         f"{_g(tr[f'trace_{t}t_node_evals_per_s'])} vs "
                         f"{_g(tr[f'token_{t}t_node_evals_per_s'])} = "
                         f"{tr[f'ratio_trace_vs_token_{t}t']:.2f}x"])
            rows.append(["trace", f"{t} thread(s): sums alone (constant programs)",
                         f"{100 * tr[f'sums_share_{t}t']:.0f}% of the trace kernel"])
    return rows


def _fmt_value(v, unit: str) -> str:
    if v is None:
        return "n/a"
    if unit == "":
        return f"{100 * v:.0f}%"
    return f"{v:.3f} {unit}" if unit == "ms" else f"{v:.2f} {unit}" if unit != "MB" \
        else f"{v:.0f} MB"


def target_rows(r: dict) -> list[list[str]]:
    rows = []
    for t in r["targets"]:
        target = f"{100 * t['target']:.0f}%" if t["unit"] == "" else f"{t['target']:g} {t['unit']}"
        status = "not checked (smoke)" if t["met"] is None else ("met" if t["met"] else "MISSED")
        rows.append([t["name"], _fmt_value(t["value"], t["unit"]), f"{t['op']} {target}", status])
    return rows


def show(result: dict, term) -> None:
    m = result["machine"]
    term.table(f"speed benchmark ({result['mode']}): {m['cpu_model']}, {m['logical_cpus']} CPUs, "
               f"{m['numba_threads']} numba threads",
               [("section", "left"), ("figure", "left"), ("value", "right")],
               table_rows(result))
    term.result("")
    term.table("targets", [("target", "left"), ("measured", "right"), ("wanted", "right"),
                           ("status", "left")], target_rows(result))


# ------------------------------------------------------------ entry point

def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["engine-child"]:
        if len(argv) != 2:
            sys.stderr.write("usage: python -m benchmarks.speed.harness engine-child SPEC_JSON\n")
            return 2
        out = _engine_child(json.loads(argv[1]))
        sys.stdout.write(json.dumps(_finite(out)) + "\n")
        return 0
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.speed.harness",
        description="Speed benchmark: kernel vs DEAP+numpy, whole run vs the DEAP reference, "
                    "champion, start-up, cold start, njit, Operon per node, trace kernel (about "
                    "6-8 minutes; --smoke: about a minute).")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes: proves the machinery, judges no target")
    ap.add_argument("--json", action="store_true",
                    help="print the JSON document on stdout instead of the table and the file")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON file to write (default: benchmarks/speed/results.json, or "
                         "benchmarks/speed/results-smoke.json with --smoke)")
    args = ap.parse_args(argv)

    from evolve.cli.render import Terminal
    term = Terminal(json_mode=args.json)
    try:
        result = run(smoke=args.smoke, note=term.note)
    except BenchError as e:
        term.error(str(e))
        return 1
    if args.json:
        term.print_json(result)
        return 0
    path = args.out or default_path(args.smoke)
    save(result, path)
    show(result, term)
    term.result(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
