"""Default locations, all inside the source checkout: the data, the traces, the
run directories and the heuristics package that write-back updates.

``EVOLVE_RUNS_DIR`` and ``EVOLVE_HEURISTICS_DIR`` override the last two (tests
use them to keep the checkout untouched); every command also takes options.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = ROOT / "datasets"
TRACES_DIR = DATA_DIR / "traces"
RUNS_DIR = ROOT / "runs"
HEURISTICS_DIR = ROOT / "heuristics"
RUNS_ENV = "EVOLVE_RUNS_DIR"
HEURISTICS_ENV = "EVOLVE_HEURISTICS_DIR"


def runs_dir(override: str | os.PathLike | None = None) -> Path:
    if override is not None and not str(override).strip():
        from evolve.runs.rundir import RunError
        raise RunError("--runs-dir: an empty value is not allowed")
    if override:
        return Path(override)
    env = os.environ.get(RUNS_ENV)
    return Path(env) if env else RUNS_DIR


def heuristics_dir(override: str | os.PathLike | None = None) -> Path:
    if override:
        return Path(override)
    env = os.environ.get(HEURISTICS_ENV)
    return Path(env) if env else HEURISTICS_DIR
