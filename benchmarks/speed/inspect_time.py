"""How long `evolve inspect` takes on a run, as right after the run finished.

    python -m benchmarks.speed.inspect_time RUN_DIR [--repeats 5] [--checkout DIR] [-- ARGS]

Runs ``evolve inspect RUN_DIR ARGS`` (``ARGS``: e.g. ``--png``) ``--repeats`` times, each
in a fresh process with the run's pictures (history.png, pareto.png) removed first, as
they are when a run has just finished, and prints each wall time, the median and the
machine. ``--checkout`` times another checkout's ``evolve`` (put first on
``PYTHONPATH``), e.g. one at an older commit, for a before/after comparison on the same
run and machine. Nothing is kept: the pictures drawn are removed again.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT
from benchmarks.speed.tour_time import describe, machine

PICTURES = ("history.png", "pareto.png")


def time_inspect(run: Path, checkout: Path, args: list[str]) -> float:
    for name in PICTURES:
        (run / name).unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(checkout), NO_COLOR="1", COLUMNS="120")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "evolve", "inspect", str(run), *args], cwd=run,
                   env=env, stdout=subprocess.DEVNULL, check=True)
    seconds = time.perf_counter() - t0
    for name in PICTURES:
        (run / name).unlink(missing_ok=True)
    return seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run directory")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--checkout", type=Path, default=ROOT,
                    help="the checkout whose evolve is timed (default: this one)")
    ap.add_argument("args", nargs="*", help="more arguments of evolve inspect (after --)")
    a = ap.parse_args(argv)
    print(f"machine: {describe(machine())}")
    run = a.run.resolve()
    times = [time_inspect(run, a.checkout.resolve(), a.args) for _ in range(a.repeats)]
    print(f"evolve inspect {run.name} {' '.join(a.args)}".rstrip()
          + f" ({a.checkout}): " + ", ".join(f"{t:.2f}" for t in times)
          + f" s; median {statistics.median(times):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
