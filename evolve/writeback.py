"""Write-back of a champion to heuristics/evolved.py: atomic, serialised, reversible.

Under an exclusive lock (``heuristics/.evolved.lock``) the current file is
scored on the run's valid split; the champion replaces it only if its valid
fitness (seed metric, the published one) is higher, or when forced. The file
replaced is kept in ``heuristics/history/``. The new text is written with
temp file + fsync + os.replace, so the file is always complete and importable
(the text is compiled, never run, before it is installed).

The target directory is ``heuristics/`` of this checkout, or
``$EVOLVE_HEURISTICS_DIR`` when that is set (tests use it to keep the real
file untouched), or the ``directory`` argument, which overrides both.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import re
import shutil
import sys
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from evolve.atomic import _fsync_dir, atomic_write_text

HEURISTICS_DIR = Path(__file__).resolve().parent.parent / "heuristics"
ENV_DIR = "EVOLVE_HEURISTICS_DIR"


def heuristics_dir(override: str | os.PathLike | None = None) -> Path:
    if override:
        return Path(override)
    env = os.environ.get(ENV_DIR)
    return Path(env) if env else HEURISTICS_DIR


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


def compile_uncached(fn):
    """The Numba ufunc of a heuristic loaded with ``load_module_from``, bypassing
    Numba's disk cache. A cache entry saved for such a module names a module that
    no other process can import, so whoever loads it next crashes: a later
    ``evolve benchmark`` of the same evolved.py, or a resumed run re-finishing
    with the same champion.py."""
    from numba import vectorize

    from heuristics.registry import SIGNATURE
    return vectorize([SIGNATURE])(fn)


def current_valid_fitness(target: Path, valid_split) -> float | None:
    """Valid fitness of the installed evolved.py, or None if it cannot be scored."""
    from evolve.scoring import score
    if not target.exists():
        return None
    try:
        mod = load_module_from(target, "_evolved_current")
        fn = getattr(mod, "evolved")
        return score(compile_uncached(fn), valid_split, repeats=1)["fitness"]
    except Exception:  # a hand-edited or broken file: anything may be wrong with it
        return None


def write_back(source: str, new_valid_fitness: float, valid_split, run_name: str,
               force: bool = False, directory: Path | None = None) -> dict:
    """Install ``source`` as evolved.py if it is better on valid; returns the decision."""
    directory = heuristics_dir(directory)
    target = directory / "evolved.py"
    compile(source, str(target), "exec")   # a SyntaxError here leaves the old file in place
    directory.mkdir(parents=True, exist_ok=True)
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
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(run_name))[:64]
            backup = hist / f"evolved-{stamp}-before-{safe}.py"
            tmp = backup.with_suffix(".tmp")
            shutil.copyfile(target, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, backup)
            _fsync_dir(hist)
        atomic_write_text(target, source)
        return {"written": True, "current_valid_fitness": current,
                "new_valid_fitness": new_valid_fitness,
                "backup": str(backup) if backup else None}
