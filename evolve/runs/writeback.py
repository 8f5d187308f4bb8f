"""Write-back of a champion to heuristics/evolved.py: atomic, serialised, reversible.

Under an exclusive lock (``heuristics/.evolved.lock``) the installed rule is
scored on the run's valid split; the champion replaces it only if its valid
fitness (seed metric, the published one) is higher, or when forced. The
installed rule is the tree in the file's ``METADATA`` literal, read with
``ast.literal_eval`` and parsed against the primitive table: nothing in the
file is imported or run. A file without a readable tree counts as absent (any
champion replaces it). The file replaced is kept in ``heuristics/history/``.
The new text is written with temp file + fsync + os.replace, so the file is
always complete and importable (the text is compiled, never run, before it is
installed).

The target directory is ``heuristics/`` of this checkout, or
``$EVOLVE_HEURISTICS_DIR`` when that is set, or the ``directory`` argument,
which overrides both (``evolve.runs.paths``).
"""

from __future__ import annotations

import ast
import fcntl
import os
import re
import shutil
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from evolve.runs.atomic import atomic_write_text, fsync_dir
from evolve.runs.paths import heuristics_dir

MAX_SOURCE_BYTES = 4 * 1024 * 1024


@contextmanager
def locked(directory: Path):
    lock_path = directory / ".evolved.lock"
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def module_metadata(path: Path) -> dict:
    """The ``METADATA`` literal of a generated module, read without importing it
    ({} when the file is missing, not a regular file, too large or not readable)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_SOURCE_BYTES:
            return {}
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "METADATA"):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def installed_tree(path: Path):
    """The parsed tree of an installed evolved.py (its METADATA), or None."""
    from evolve.lang import treeio
    text = module_metadata(path).get("tree")
    try:
        return treeio.parse(text)
    except treeio.TreeError:
        return None


def current_valid_fitness(target: Path, valid_split) -> float | None:
    """Valid fitness of the installed rule, or None if it has no readable tree."""
    from evolve.lang import codegen
    from evolve.objectives.tokens import champion_counts
    nodes = installed_tree(target)
    if nodes is None or codegen.uses_trace_inputs(nodes):
        return None
    return champion_counts(nodes, valid_split).metrics()["fitness"]


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
            fsync_dir(hist)
        atomic_write_text(target, source)
        return {"written": True, "current_valid_fitness": current,
                "new_valid_fitness": new_valid_fitness,
                "backup": str(backup) if backup else None}
