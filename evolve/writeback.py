"""Write-back of a champion to heuristics/evolved.py: atomic, serialised, reversible.

Under an exclusive lock (``heuristics/.evolved.lock``) the current file is
scored on the run's valid split; the champion replaces it only if its valid
fitness (seed metric, the published one) is higher, or when forced. The file
replaced is kept in ``heuristics/history/``. The new text is written with
temp file + fsync + os.replace, so the file is always complete and importable.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from evolve.atomic import atomic_write_text

HEURISTICS_DIR = Path(__file__).resolve().parent.parent / "heuristics"


@contextmanager
def locked(directory: Path):
    lock_path = directory / ".evolved.lock"
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def load_module_from(path: Path, name: str):
    """Import a heuristic module from a file the harness itself generated."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.modules.pop(name, None)
    return mod


def current_valid_fitness(target: Path, valid_split) -> float | None:
    """Valid fitness of the installed evolved.py, or None if it cannot be scored."""
    from evolve.scoring import score
    from heuristics.registry import compile_function
    if not target.exists():
        return None
    try:
        mod = load_module_from(target, "_evolved_current")
        fn = getattr(mod, "evolved")
        return score(compile_function(fn), valid_split, repeats=1)["fitness"]
    except Exception:  # a hand-edited or broken file: anything may be wrong with it
        return None


def write_back(source: str, new_valid_fitness: float, valid_split, run_name: str,
               force: bool = False, directory: Path | None = None) -> dict:
    """Install ``source`` as evolved.py if it is better on valid; returns the decision."""
    directory = directory or HEURISTICS_DIR
    target = directory / "evolved.py"
    with locked(directory):
        current = current_valid_fitness(target, valid_split)
        better = current is None or new_valid_fitness > current
        if not (better or force):
            return {"written": False, "current_valid_fitness": current,
                    "new_valid_fitness": new_valid_fitness, "backup": None}
        backup = None
        if target.exists():
            hist = directory / "history"
            hist.mkdir(exist_ok=True)
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
            backup = hist / f"evolved-{stamp}-before-{run_name}.py"
            tmp = backup.with_suffix(".tmp")
            shutil.copyfile(target, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, backup)
        atomic_write_text(target, source)
        return {"written": True, "current_valid_fitness": current,
                "new_valid_fitness": new_valid_fitness,
                "backup": str(backup) if backup else None}
