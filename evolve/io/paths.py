"""Default locations: the data, the traces, the run directories and the heuristics
package that write-back updates.

Run from a source checkout (an editable install, as the Makefile makes), the data,
run and heuristics directories are the checkout's ``datasets/``, ``runs/`` and
``heuristics/`` (the package itself). Installed from a wheel (``pip install .``),
the package has no checkout around it: they are then ``datasets/``, ``runs/`` and
``heuristics/`` of the working directory, so a write-back stays in the project it
was made for and never changes the installed package (``evolve benchmark`` and
``evolve export --installed`` read the champion from there; until a run writes one
back, the package's own ``heuristics/evolved.py``, standard rejection, stands in).

``EVOLVE_RUNS_DIR`` and ``EVOLVE_HEURISTICS_DIR`` override the last two (tests
use them to keep the checkout untouched); every command also takes options.
"""

from __future__ import annotations

import os
from pathlib import Path

from evolve.errors import EvolveError

PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def is_checkout(root: Path) -> bool:
    """Whether ``root`` is this project's source checkout (not site-packages)."""
    return (root / "pyproject.toml").is_file() and (root / "evolve" / "__init__.py").is_file()


ROOT = PACKAGE_ROOT if is_checkout(PACKAGE_ROOT) else Path.cwd()
DATA_DIR = ROOT / "datasets"
TRACES_DIR = DATA_DIR / "traces"
RUNS_DIR = ROOT / "runs"
PACKAGE_HEURISTICS = PACKAGE_ROOT / "heuristics"     # the installed package's own folder
HEURISTICS_DIR = ROOT / "heuristics"                  # where write-back goes by default
RUNS_ENV = "EVOLVE_RUNS_DIR"
HEURISTICS_ENV = "EVOLVE_HEURISTICS_DIR"


class RunError(EvolveError):
    """A run directory that is missing, foreign or damaged; one-line message."""


def runs_dir(override: str | os.PathLike | None = None) -> Path:
    if override is not None and not str(override).strip():
        raise RunError.of("runs_dir", "an empty value is not allowed")
    if override:
        return Path(override)
    env = os.environ.get(RUNS_ENV)
    return Path(env) if env else RUNS_DIR


def heuristics_dir(override: str | os.PathLike | None = None) -> Path:
    if override:
        return Path(override)
    env = os.environ.get(HEURISTICS_ENV)
    return Path(env) if env else HEURISTICS_DIR


def check_creatable(directory: str | os.PathLike, param: str, error=RunError) -> None:
    """``directory`` is a directory we may create entries in, or can be made (its
    nearest existing ancestor is a directory we may write in); else ``error`` about
    ``param`` (one line naming the path). Creates nothing: a command checks where it
    will write before any work, and makes the directory once that work is done."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise error.of(param, f"{directory}: exists and is not a directory")
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent          # nearest existing ancestor: mkdir needs to write there
    if not probe.is_dir():
        raise error.of(param, f"{directory}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise error.of(param, f"{directory}: not writable")
