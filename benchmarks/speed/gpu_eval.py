"""Population evaluation on a torch device against the Numba kernels, measured in one
run: node evaluations per second of the token kernel and one generation of the trace
kernel, by each device kernel (the fused Triton one and the torch one), with every
kernel's results compared bit for bit with the Numba kernel's before any timing.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.gpu_eval [--device cuda|cpu] [--kernels fused,torch]
                                  [--token-rows N] [--trees N] [--drafted N]
                                  [--population N] [--repeats N] [--torch-repeats N]
                                  [--torch-threads N] [--smoke] [--json FILE]

1. token  The speed benchmark's random population (``benchmarks/speed/harness.py``: token
          primitives, heights 2..6, its seed; ``--trees``) over the token train split
          tiled to ``--token-rows`` rows: ``evolve.kernels.tokens.population_counts``
          on all Numba threads against ``evolve.kernels.gpu.tokens.population_counts``
          on the torch device with each of ``--kernels``. Node evaluations count every
          node times every row; for the torch kernel also its operations (each one pass
          over the rows) per node.
2. trace  One generation of ``--population`` random trace-rule trees (trace
          primitives, heights 2..6) over n-gram traces of about ``--drafted`` drafted
          tokens (``evolve.data.sources.ngram``, the train split): the sums of
          ``--objective speed`` (``population_sums``, no KL) by the Numba kernel on
          all threads against ``evolve.kernels.gpu.traces.population_sums``.

``--device cpu`` runs the device kernels on the CPU (figures "torch on CPU", not GPU
figures; the fused kernel there runs in Triton's interpreter, far slower than anything,
so it is measured only when ``--kernels`` names it); the default is cuda when torch sees
a CUDA device, with both kernels. ``--smoke`` uses tiny sizes (tests/test_bench_gpu_eval.py
runs it) and checks the results but no target. ``python -m benchmarks.speed.gpu_check`` runs
this with the Hugging Face figures in one table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


import numpy as np  # noqa: E402

from benchmarks.common import one_line  # noqa: E402

TARGETS = {"token_node_evals_per_s": 3e11, "trace_generation_speedup": 30.0}   # on an H100


def _median_time(fn, repeats: int, sync) -> float:
    """The median seconds of ``repeats`` calls of fn (its first call, which compiles,
    uploads and warms the caches, was the check of its results)."""
    ts = []
    for _ in range(max(1, repeats)):
        t = time.perf_counter()
        fn()
        sync()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def _trees(pset, n: int, seed: int):
    from benchmarks.speed.sizes import FULL, random_trees
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


def _repeats(args, kernel: str) -> int:
    return args.torch_repeats if kernel == "torch" and args.torch_repeats else args.repeats


def _identical(section: str, kernels, run, want, strict: bool = True):
    """Each kernel's first result (also its warm-up: it compiles, uploads and fills the
    caches) equals the Numba kernel's, or stop. With ``strict`` off, a kernel that fails
    or differs is left out instead: (the kernels to time, {kernel: why not})."""
    ok, failed = [], {}
    for kern in kernels:
        try:
            same = np.array_equal(run(kern), want)
            why = "" if same else "its results differ from the Numba kernel's"
        except Exception as e:          # noqa: BLE001 (a kernel that cannot run here)
            if strict:
                raise
            why = one_line(e)
        if why and strict:
            raise SystemExit(f"gpu_eval: the {kern} {section} results differ from the Numba "
                             "kernel's")
        if why:
            failed[kern] = why
        else:
            ok.append(kern)
    return ok, failed


def token_inputs(rows: int, trees: int):
    """(programs, split): the speed benchmark's random token population and the token
    train split tiled to ``rows`` rows."""
    from evolve.data import tokens
    from evolve.io.paths import DATA_DIR
    from evolve.kernels import tokens as tk
    from evolve.lang import primitives as P
    from benchmarks.speed.sizes import FULL
    ds = tokens.load_npz(DATA_DIR / "train.npz")
    reps = -(-rows // len(ds))
    cols = {f: np.ascontiguousarray(np.tile(v, reps)[:rows])
            for f, v in ds.columns().items()}
    split = tk.TokenArrays(tokens.Dataset(**cols, name="train"))
    return _trees(P.make_pset(), trees, FULL.pop_seed), split


def trace_inputs(drafted: int, population: int):
    """(programs, trace arrays, seconds to build them): ``population`` random trace
    trees and n-gram train traces of about ``drafted`` drafted tokens (g = 4)."""
    from evolve.data.sources import ngram
    from evolve.lang import primitives as P
    from evolve.objectives.spec import TraceArrays
    g, blocks = 4, 16
    prompts = max(1, drafted // (g * blocks))
    cfg = ngram.TraceConfig(train_prompts=prompts, block_size=g, blocks_per_prompt=blocks)
    t = time.perf_counter()
    sa = TraceArrays.from_split(ngram.build_split(ngram.build_pair(cfg), "train"))
    return _trees(P.make_pset(trace=True), population, 7), sa, time.perf_counter() - t


def token_section(args, dev, sync) -> dict:
    from evolve.kernels import tokens as tk
    from evolve.kernels.gpu import tokens as gt
    progs, split = token_inputs(args.token_rows, args.trees)
    nodes = int(progs.lengths.sum())

    def run(kern):
        return gt.population_counts(progs, split, kernel=kern, device=dev)
    kernels, failed = _identical("token", args.kernels, run, tk.population_counts(progs, split),
                                 getattr(args, "strict", True))
    out = {"trees": len(progs), "nodes": nodes, "rows": split.n, "identical": True,
           "kernels": kernels, "failed": failed}
    out["numba_s"] = _median_time(lambda: tk.population_counts(progs, split), args.repeats,
                                  lambda: None)
    out["numba_node_evals_per_s"] = nodes * split.n / out["numba_s"]
    for kern in kernels:
        sec = _median_time(lambda: run(kern), _repeats(args, kern), sync)
        out[f"{kern}_s"] = sec
        out[f"{kern}_node_evals_per_s"] = nodes * split.n / sec
        out[f"{kern}_over_numba"] = out["numba_s"] / sec
    if "torch" in kernels:
        out["torch_ops_per_node"] = ops_per_node(
            lambda: gt.population_counts(progs, split, chunk_rows=split.n,
                                         kernel="torch", device=dev), nodes)
    return out


def trace_section(args, dev, sync) -> dict:
    from evolve.kernels import speculative
    from evolve.kernels.gpu import traces as gtr
    progs, sa, built = trace_inputs(args.drafted, args.population)
    nodes = int(progs.lengths.sum())
    rows = sa.n * sa.k

    def run(kern):
        return gtr.population_sums(progs, sa, with_kl=False, kernel=kern, device=dev)
    kernels, failed = _identical("trace", args.kernels, run,
                                 speculative.population_sums(progs, sa, with_kl=False),
                                 getattr(args, "strict", True))
    out = {"population": len(progs), "nodes": nodes, "drafted_tokens": sa.n,
           "candidate_rows": rows, "block_size": sa.g, "top_k": sa.k, "build_s": built,
           "identical": True, "kernels": kernels, "failed": failed}
    out["numba_generation_s"] = _median_time(
        lambda: speculative.population_sums(progs, sa, with_kl=False), args.repeats,
        lambda: None)
    out["numba_node_evals_per_s"] = nodes * rows / out["numba_generation_s"]
    for kern in kernels:
        sec = _median_time(lambda: run(kern), _repeats(args, kern), sync)
        out[f"{kern}_generation_s"] = sec
        out[f"{kern}_node_evals_per_s"] = nodes * rows / sec
        out[f"{kern}_speedup"] = out["numba_generation_s"] / sec
    if "torch" in kernels:                           # the names earlier results used
        out["generation_speedup"] = out["torch_speedup"]
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--kernels", default=None,
                    help="device kernels, comma-separated: fused, torch (default: both on "
                         "cuda, torch on cpu)")
    ap.add_argument("--token-rows", type=int, default=4_000_000)
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--drafted", type=int, default=1_000_000)
    ap.add_argument("--population", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--torch-repeats", type=int, default=None,
                    help="timed calls of the torch kernel (default: --repeats)")
    ap.add_argument("--torch-threads", type=int, default=None,
                    help="torch's CPU threads (torch on CPU only; default: torch's own)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    return ap


def kernel_list(text, dev) -> tuple:
    from evolve.kernels.gpu import KERNELS
    names = tuple(text.split(",")) if text else (KERNELS if dev.type == "cuda" else ("torch",))
    bad = [k for k in names if k not in KERNELS]
    if bad:
        raise SystemExit(f"gpu_eval: --kernels: {bad[0]!r} is not one of {', '.join(KERNELS)}")
    return names


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.smoke:
        args.token_rows, args.trees, args.drafted, args.population, args.repeats = (
            3000, 20, 2048, 20, 1)
    import numba
    import torch
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    args.kernels = kernel_list(args.kernels, dev)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    doc = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
           else "torch on CPU (not a GPU figure)",
           "numba_threads": numba.get_num_threads(), "torch_threads": torch.get_num_threads(),
           "cpu_count": os.cpu_count(), "smoke": args.smoke,
           "token": token_section(args, dev, sync), "trace": trace_section(args, dev, sync)}
    tok, tr = doc["token"], doc["trace"]
    print(f"device: {doc['device']}; Numba threads {doc['numba_threads']}, "
          f"torch threads {doc['torch_threads']}")
    line = ", ".join(f"{k} {tok[f'{k}_node_evals_per_s']:.3g} ({tok[f'{k}_over_numba']:.2f}x)"
                     for k in args.kernels)
    print(f"token kernel, {tok['trees']} trees x {tok['rows']:,} rows: "
          f"Numba {tok['numba_node_evals_per_s']:.3g} node evals/s, {line}, identical"
          + (f"; {tok['torch_ops_per_node']:.2f} torch operations per node"
             if "torch" in args.kernels else ""))
    line = ", ".join(f"{k} {tr[f'{k}_generation_s']:.3g} s ({tr[f'{k}_speedup']:.2f}x)"
                     for k in args.kernels)
    print(f"trace generation, {tr['population']} trees x {tr['drafted_tokens']:,} drafted "
          f"tokens ({tr['candidate_rows']:,} candidate rows): Numba "
          f"{tr['numba_generation_s']:.3g} s, {line}, identical")
    if dev.type == "cuda" and not args.smoke:
        print(f"targets (H100): token >= {TARGETS['token_node_evals_per_s']:.0e} node "
              f"evals/s, trace generation >= {TARGETS['trace_generation_speedup']:.0f}x")
    if args.json:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
