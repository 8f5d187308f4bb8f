"""Population evaluation on a torch device against the Numba kernels, measured in one
run: node evaluations per second of the token kernel and one generation of the trace
kernel, with the results compared bit for bit before any timing.

A script of the source checkout, not part of the ``evolve`` package::

    python benchmarks/gpu_eval.py [--device cuda|cpu] [--token-rows N] [--trees N]
                                  [--drafted N] [--population N] [--repeats N]
                                  [--torch-threads N] [--smoke] [--json FILE]

1. token  The speed benchmark's random population (``benchmarks/speed.py``: token
          primitives, heights 2..6, its seed; ``--trees``) over the token train split
          tiled to ``--token-rows`` rows: ``evolve.kernels.tokens.population_counts``
          on all Numba threads against ``evolve.kernels.gpu.tokens.population_counts``
          on the torch device. Node evaluations count every node times every row;
          also the torch operations (each one pass over the rows) per node.
2. trace  One generation of ``--population`` random trace-rule trees (trace
          primitives, heights 2..6) over n-gram traces of about ``--drafted`` drafted
          tokens (``evolve.data.sources.ngram``, the train split): the sums of
          ``--objective speed`` (``population_sums``, no KL) by the Numba kernel on
          all threads against ``evolve.kernels.gpu.traces.population_sums``.

``--device cpu`` runs the torch code on the CPU (figures "torch on CPU", not GPU
figures); the default is cuda when torch sees a CUDA device. ``--smoke`` uses tiny
sizes (tests/test_gpu_bench.py runs it) and checks the results but no target.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "benchmarks"):      # `import evolve`; the speed benchmark's trees
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402

TARGETS = {"token_node_evals_per_s": 1e11, "trace_generation_speedup": 30.0}   # on an H100


def _median_time(fn, repeats: int, sync) -> tuple[float, object]:
    out = fn()                               # compile or load, upload, warm the caches
    sync()
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def _trees(pset, n: int, seed: int):
    from speed import FULL, random_trees
    from evolve.lang import treeio
    return treeio.linearise([treeio.from_deap(t) for t in random_trees(
        pset, n, FULL.pop_min_height, FULL.pop_max_height, seed)])


def ops_per_node(fn, nodes: int) -> float:
    """Device operations (kernel launches: each a pass over the rows) per program node
    while ``fn`` runs, counted by torch's dispatcher (views and copies to the host
    included), or NaN where torch cannot count them."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
    except ImportError:
        return float("nan")
    count = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count[0] += 1
            return func(*args, **(kwargs or {}))
    with Count():
        fn()
    return count[0] / nodes


def token_section(args, dev, sync) -> dict:
    from evolve.data import tokens
    from evolve.io.paths import DATA_DIR
    from evolve.kernels import tokens as tk
    from evolve.kernels.gpu import tokens as gt
    from evolve.lang import primitives as P
    from speed import FULL
    ds = tokens.load_npz(DATA_DIR / "train.npz")
    reps = -(-args.token_rows // len(ds))
    cols = {f: np.ascontiguousarray(np.tile(v, reps)[:args.token_rows])
            for f, v in ds.columns().items()}
    split = tk.SplitArrays(tokens.Dataset(**cols, name="train"))
    progs = _trees(P.make_pset(), args.trees, FULL.pop_seed)
    nodes = int(progs.lengths.sum())
    cpu_s, want = _median_time(lambda: tk.population_counts(progs, split), args.repeats,
                               lambda: None)
    dev_s, got = _median_time(lambda: gt.population_counts(progs, split, dev), args.repeats,
                              sync)
    if not np.array_equal(got, want):
        raise SystemExit("gpu_eval: the torch token counts differ from the Numba kernel's")
    per_node = ops_per_node(lambda: gt.population_counts(progs, split, dev,
                                                         chunk_rows=split.n), nodes)
    return {"trees": len(progs), "nodes": nodes, "rows": split.n, "numba_s": cpu_s,
            "torch_ops_per_node": per_node,
            "torch_s": dev_s, "numba_node_evals_per_s": nodes * split.n / cpu_s,
            "torch_node_evals_per_s": nodes * split.n / dev_s, "torch_over_numba": cpu_s / dev_s,
            "identical": True}


def trace_section(args, dev, sync) -> dict:
    from evolve.data.sources import ngram
    from evolve.kernels import speculative
    from evolve.kernels.gpu import traces as gtr
    from evolve.lang import primitives as P
    from evolve.objectives.spec import SpecArrays
    g, blocks = 4, 16
    prompts = max(1, args.drafted // (g * blocks))
    cfg = ngram.TraceConfig(train_prompts=prompts, block_size=g, blocks_per_prompt=blocks)
    t = time.perf_counter()
    sa = SpecArrays.from_split(ngram.build_split(ngram.build_pair(cfg), "train"))
    built = time.perf_counter() - t
    progs = _trees(P.make_pset(trace=True), args.population, 7)
    nodes = int(progs.lengths.sum())
    rows = sa.n * sa.k
    cpu_s, want = _median_time(lambda: speculative.population_sums(progs, sa, with_kl=False),
                               args.repeats, lambda: None)
    dev_s, got = _median_time(lambda: gtr.population_sums(progs, sa, dev), args.repeats, sync)
    if not np.array_equal(got, want):
        raise SystemExit("gpu_eval: the torch trace sums differ from the Numba kernel's")
    return {"population": len(progs), "nodes": nodes, "drafted_tokens": sa.n,
            "candidate_rows": rows, "block_size": sa.g, "top_k": sa.k, "build_s": built,
            "numba_generation_s": cpu_s, "torch_generation_s": dev_s,
            "generation_speedup": cpu_s / dev_s,
            "numba_node_evals_per_s": nodes * rows / cpu_s,
            "torch_node_evals_per_s": nodes * rows / dev_s, "identical": True}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--token-rows", type=int, default=4_000_000)
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--drafted", type=int, default=1_000_000)
    ap.add_argument("--population", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch's CPU threads (torch on CPU only; default: torch's own)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.smoke:
        args.token_rows, args.trees, args.drafted, args.population, args.repeats = (
            3000, 20, 2048, 20, 1)
    import numba
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    doc = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
           else "torch on CPU (not a GPU figure)",
           "numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "smoke": args.smoke,
           "token": token_section(args, dev, sync), "trace": trace_section(args, dev, sync)}
    tok, tr = doc["token"], doc["trace"]
    print(f"device: {doc['device']}; Numba threads {doc['numba_threads']}, "
          f"torch threads {doc['torch_threads']}")
    print(f"token kernel, {tok['trees']} trees x {tok['rows']:,} rows: "
          f"Numba {tok['numba_node_evals_per_s']:.3g} node evals/s, torch "
          f"{tok['torch_node_evals_per_s']:.3g} ({tok['torch_over_numba']:.2f}x), identical; "
          f"{tok['torch_ops_per_node']:.2f} torch operations per node")
    print(f"trace generation, {tr['population']} trees x {tr['drafted_tokens']:,} drafted "
          f"tokens ({tr['candidate_rows']:,} candidate rows): Numba "
          f"{tr['numba_generation_s']:.3g} s, torch {tr['torch_generation_s']:.3g} s "
          f"({tr['generation_speedup']:.2f}x), identical")
    if dev.type == "cuda" and not args.smoke:
        print(f"targets (H100): token >= {TARGETS['token_node_evals_per_s']:.0e} node "
              f"evals/s, trace generation >= {TARGETS['trace_generation_speedup']:.0f}x")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
