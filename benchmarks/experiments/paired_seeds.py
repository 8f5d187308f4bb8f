"""What the experiments that run two searches a seed share (first_tokens, token_class).

Each runs, for every trace directory, budget and seed, one search without a change and
one with it, the same seed and settings, and reports each champion on test and the
difference paired by seed: the mean and the range over seeds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import publish  # noqa: E402

import numpy as np  # noqa: E402

from evolve.io import paths  # noqa: E402
from benchmarks.experiments.trace_results import _commit, _shown  # noqa: E402

# the real pair's traces and the default ones: those recorded here
DATA = (paths.DATA_DIR / "pairs" / "smollm2" / "results" / "traces", paths.DATA_DIR / "traces")


def arguments(description: str, out: Path) -> argparse.ArgumentParser:
    """The options every such experiment takes; the caller adds its own."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", type=Path, nargs="+", default=None,
                    help="trace directories [the real pair's, the default traces: those "
                         "there]")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.01, 0.03])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--population", type=int, default=300)
    ap.add_argument("--generations", type=int, default=30)
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--page", action="store_true",
                    help="write the section of docs/results/real-pair.md")
    return ap


def start(a, module: str, argv, **fields) -> tuple[list, dict]:
    """(the trace directories to run on, the report's head: commit, the command as
    typed, settings and ``fields``)."""
    data = a.data or [d for d in DATA if (d / "test.npz").exists()]
    if not data:
        raise SystemExit("no trace directory: record one (evolve data trace) or pass --data")
    shown = (_shown(Path(x)) if Path(x).is_absolute() else x
             for x in (argv if argv is not None else sys.argv[1:]))
    doc = {"commit": _commit(), "command": " ".join([f"python -m {module}", *shown]),
           "out": _shown(a.out), **fields, "population": a.population,
           "generations": a.generations, "data": {}, "started": time.perf_counter()}
    return data, doc


def finish(doc: dict, a, markdown, section: str) -> int:
    """Write the report (and the page's section with ``--page``), print the markdown."""
    doc["seconds"] = round(time.perf_counter() - doc.pop("started"), 1)
    return publish(doc, a.out, markdown, section, a.page)


def spread(x) -> dict:
    """The mean, smallest and largest of x."""
    x = np.asarray(x, dtype=np.float64)
    return {"mean": float(x.mean()), "min": float(x.min()), "max": float(x.max())}


def paired(before: list, after: list, metrics) -> dict:
    """{metric: the spread of after minus before}, the two lists paired by seed."""
    return {m: spread([y[m] - x[m] for x, y in zip(before, after)]) for m in metrics}


def span(values, digits: int = 4) -> str:
    """'mean (min to max)' of values."""
    s = spread(values)
    return f"{s['mean']:.{digits}f} ({s['min']:.{digits}f} to {s['max']:.{digits}f})"


def signed(s: dict, digits: int = 4) -> str:
    """A paired difference's spread, signed: '+mean (+min to +max)'."""
    return f"{s['mean']:+.{digits}f} ({s['min']:+.{digits}f} to {s['max']:+.{digits}f})"
