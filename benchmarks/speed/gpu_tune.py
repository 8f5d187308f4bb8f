"""The fused kernels' launch constants, timed on a GPU: every configuration's results
are compared with the Numba kernels' bit for bit before it is timed, and one table
shows them all next to the present defaults, measured in the same run.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.gpu_tune [--smoke] [--json FILE] [--budget S]
                                  [--kernels token,trace] [--token-rows N] [--trees N]
                                  [--drafted N] [--population N] [--repeats N]

The constants are those of ``evolve/kernels/gpu/fused.py``, read at every launch:
``TOKEN_BLOCK`` (rows per tile), ``TILES_PER_ITEM`` (tiles per work item),
``TRACE_BLOCK`` (trace blocks per tile), ``WARPS`` (per thread block; a thread holds
BLOCK / (32 WARPS) rows or trace blocks) and ``BLOCKS_PER_SM``. The inputs are those of
``gpu_eval.py`` (1,000 random trees over 4M token rows; 1,000 trace trees over n-gram
traces of 1M drafted tokens). A configuration Triton cannot compile or launch, or
whose results differ, is named and not timed. Configurations that would start after
``--budget`` seconds (default 420) are reported as not run. Each figure is the median
of ``--repeats`` timed calls after the untimed call that checked the results. The
first row of each kernel is the present default. ``--kernels`` sweeps only the kernels
named (default both); ``--json`` is written after each kernel's sweep, so a run stopped
by a time limit keeps what it measured.

``--smoke`` runs two configurations of each kernel at tiny sizes on the CPU when
there is no GPU (Triton's interpreter), which ``tests/test_bench_gpu_tune.py`` runs;
no figure of it means anything. Without ``--smoke`` and without a CUDA device it is
one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import one_line
from benchmarks.speed.gpu_eval import _median_time

# (TOKEN_BLOCK, TILES_PER_ITEM, WARPS, BLOCKS_PER_SM); the default first
TOKEN_CONFIGS = [(256, 16, 4, 16), (512, 16, 4, 16), (1024, 16, 4, 16), (512, 16, 8, 8),
                 (1024, 16, 8, 8), (256, 4, 4, 16), (256, 64, 4, 16), (256, 16, 4, 8)]
# (TRACE_BLOCK, WARPS, BLOCKS_PER_SM); the default first
TRACE_CONFIGS = [(128, 4, 16), (256, 4, 16), (512, 4, 16), (256, 4, 8), (64, 2, 32),
                 (256, 8, 8), (512, 8, 8), (128, 4, 8)]
FULL = dict(token_rows=4_000_000, trees=1000, drafted=1_000_000, population=1000, repeats=3)
SMOKE = dict(token_rows=600, trees=4, drafted=32, population=1, repeats=1)


def _constants(F, names: tuple, values: tuple):
    """Set the fused module's constants ``names`` to ``values``; the old ones back."""
    old = tuple(getattr(F, n) for n in names)
    for n, v in zip(names, values):
        setattr(F, n, v)
    return old


def sweep(kind: str, configs, names, run, want, count: float, repeats: int, sync, left,
          same) -> list:
    """One row per configuration: its figures, or why it was not timed."""
    from evolve.kernels.gpu import fused as F
    rows = []
    for cfg in configs:
        row = dict(zip(names, cfg))
        if left() <= 0:
            rows.append(row | {"not_run": "the budget was spent"})
            continue
        old = _constants(F, names, cfg)
        try:
            try:
                if not same(run(), want):
                    rows.append(row | {"failed": "results differ from the Numba kernel's"})
                    continue
            except Exception as e:             # noqa: BLE001 (a configuration that fails)
                rows.append(row | {"failed": one_line(e, 120)})
                continue
            sec = _median_time(run, repeats, sync)
            rows.append(row | {"seconds": sec, "node_evals_per_s": count / sec})
        finally:
            _constants(F, names, old)
        print(f"gpu_tune: {kind} {row}: {rows[-1].get('seconds', rows[-1].get('failed'))}",
              file=sys.stderr, flush=True)
    return rows


def run(args, save=lambda doc: None) -> dict:
    """The sweeps of ``args.kernels``; ``save(doc)`` after each."""
    import torch
    t0 = time.perf_counter()
    if torch.cuda.is_available():
        dev = torch.device("cuda")
    elif args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        dev = torch.device("cpu")
    else:
        raise SystemExit("gpu_tune: no CUDA device; --smoke checks the machinery on the CPU")
    from benchmarks.speed import gpu_eval
    from evolve.kernels import speculative
    from evolve.kernels import tokens as tk
    from evolve.kernels.gpu import tokens as gt
    from evolve.kernels.gpu import traces as gtr
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    left = lambda: args.budget - (time.perf_counter() - t0)     # noqa: E731
    token_configs = TOKEN_CONFIGS[:2] if args.smoke else TOKEN_CONFIGS
    trace_configs = TRACE_CONFIGS[:2] if args.smoke else TRACE_CONFIGS
    doc = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda"
           else "no GPU: Triton's interpreter (--smoke; not GPU figures)",
           "smoke": args.smoke, "repeats": args.repeats}
    if "token" in args.kernels:
        progs, split = gpu_eval.token_inputs(args.token_rows, args.trees)
        doc["token"] = {"trees": len(progs), "rows": split.n, "configs": sweep(
            "token", token_configs,
            ("TOKEN_BLOCK", "TILES_PER_ITEM", "WARPS", "BLOCKS_PER_SM"),
            lambda: gt.population_counts(progs, split, kernel="fused", device=dev),
            tk.population_counts(progs, split), float(progs.lengths.sum()) * split.n,
            args.repeats, sync, left, np.array_equal)}
        doc["seconds"] = time.perf_counter() - t0
        save(doc)
    if "trace" in args.kernels:
        progs, sa, _ = gpu_eval.trace_inputs(args.drafted, args.population)
        doc["trace"] = {"population": len(progs), "drafted_tokens": sa.n, "configs": sweep(
            "trace", trace_configs, ("TRACE_BLOCK", "WARPS", "BLOCKS_PER_SM"),
            lambda: gtr.population_sums(progs, sa, with_kl=False, kernel="fused", device=dev),
            speculative.population_sums(progs, sa, with_kl=False),
            float(progs.lengths.sum()) * sa.n * sa.k, args.repeats, sync, left,
            np.array_equal)}
        doc["seconds"] = time.perf_counter() - t0
        save(doc)
    return doc


def table(doc: dict) -> str:
    lines = [f"fused kernel launch constants on {doc['device']} (median of "
             f"{doc['repeats']} timed calls; the first row of each kernel is the default)"]
    for kind in ("token", "trace"):
        if kind not in doc:
            continue
        rows = doc[kind]["configs"]
        base = rows[0].get("seconds")
        for r in rows:
            cfg = ", ".join(f"{k}={v}" for k, v in r.items()
                            if k not in ("seconds", "node_evals_per_s", "failed", "not_run"))
            if "seconds" in r:
                ratio = f"{base / r['seconds']:.2f}x the default" if base else ""
                fig = f"{r['seconds']:.4g} s, {r['node_evals_per_s']:.3g} node evals/s  {ratio}"
            else:
                fig = ("failed: " + r["failed"]) if "failed" in r else "not run: " + r["not_run"]
            lines.append(f"{kind:5s}  {cfg:60s}  {fig}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--budget", type=float, default=420.0)
    ap.add_argument("--kernels", default="token,trace",
                    help="the kernels to sweep, comma-separated: token, trace")
    for name in ("token-rows", "trees", "drafted", "population", "repeats"):
        ap.add_argument(f"--{name}", type=int, default=None)
    args = ap.parse_args(argv)
    for k, v in (SMOKE if args.smoke else FULL).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.kernels = tuple(args.kernels.split(","))
    bad = [k for k in args.kernels if k not in ("token", "trace")]
    if bad:
        ap.error(f"--kernels: {bad[0]!r} is not token or trace")

    def save(doc):
        if args.json:
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
    doc = run(args, save)
    print(table(doc))
    bad = [r for kind in ("token", "trace") for r in doc.get(kind, {}).get("configs", ())
           if "failed" in r]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
