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
which overrides both (``evolve.io.paths``).
"""

from __future__ import annotations

import ast
import fcntl
import re
import shutil
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from evolve.io.atomic import atomic_write_text, atomic_write_with
from evolve.io.paths import heuristics_dir
from evolve.lang import treeio
from evolve.lang import codegen
from evolve.objectives.tokens import champion_counts
from evolve.objectives.spec import population_results
from evolve.objectives.fitness import speed_fitness
from evolve.standing import WINS

MAX_SOURCE_BYTES = 4 * 1024 * 1024


def refusal(meta: dict, force: bool, module: str) -> dict | None:
    """The write-back decision for a champion that does not win on valid (its
    ``standing`` in ``meta``) and is not forced: not written, with the verdict and why;
    None when it may be written back."""
    st = meta.get("standing") or {}
    if force or st.get("verdict", WINS) == WINS:
        return None
    return {"written": False, "module": module, "refused": st["verdict"], "why": st["why"]}


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
    text = module_metadata(path).get("tree")
    try:
        return treeio.parse(text)
    except treeio.TreeError:
        return None


def current_valid_fitness(target: Path, valid_split) -> float | None:
    """Valid fitness of the installed rule, or None if it has no readable tree."""
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
        backup = keep_in_history(target, directory, run_name)
        atomic_write_text(target, source)
        return {"written": True, "current_valid_fitness": current,
                "new_valid_fitness": new_valid_fitness,
                "backup": str(backup) if backup else None}


# ------------------------------------------------------------ trace champions

TRACE_MODULE = "evolved_trace.py"


def installed_trace(directory: Path | None = None):
    """``(nodes, METADATA)`` of the installed trace rule (heuristics/evolved_trace.py),
    or None when it is missing or has no readable tree (read, never imported)."""
    path = heuristics_dir(directory) / TRACE_MODULE
    meta = module_metadata(path)
    try:
        return treeio.parse(meta.get("tree")), meta
    except treeio.TreeError:
        return None


def trace_valid_score(nodes, sa_valid, budget: float) -> dict:
    """A tree's speed score on a valid trace split at a TV budget (the score a
    speed run ranks champions by), with its tokens per call and TV per token."""
    from evolve.lang import treeio                       # lazy: start-up
    res = population_results(treeio.linearise([nodes]), sa_valid, with_kl=False)[0]
    return {"score": float(speed_fitness(res.tokens_per_call, res.tv_per_token, budget)),
            "tokens_per_call": res.tokens_per_call, "tv_per_token": res.tv_per_token}


def write_back_trace(source: str, nodes, sa_valid, budget: float, run_name: str,
                     force: bool = False, directory: Path | None = None) -> dict:
    """Install ``source`` as evolved_trace.py if its tree scores higher than the
    installed trace rule on this run's valid split at this run's TV budget (or
    when forced). Same lock, history and atomic write as ``write_back``."""
    directory = heuristics_dir(directory)
    target = directory / TRACE_MODULE
    compile(source, str(target), "exec")   # a SyntaxError here leaves the old file in place
    directory.mkdir(parents=True, exist_ok=True)
    new = trace_valid_score(nodes, sa_valid, budget)["score"]
    with locked(directory):
        installed = installed_trace(directory)
        current = None if installed is None else \
            trace_valid_score(installed[0], sa_valid, budget)["score"]
        decision = {"module": TRACE_MODULE, "tv_budget": budget,
                    "current_valid_score": current, "new_valid_score": new}
        if not (current is None or new > current or force):
            return {"written": False, **decision, "backup": None}
        backup = keep_in_history(target, directory, run_name)
        atomic_write_text(target, source)
        return {"written": True, **decision, "backup": str(backup) if backup else None}


def keep_in_history(target: Path, directory: Path, run_name: str) -> Path | None:
    """Copy ``target`` (if it exists) to history/<stem>-<time>-before-<run>.py, durably
    and atomically: a write that fails (a full disk) leaves no temporary file."""
    if not target.exists():
        return None
    hist = directory / "history"
    hist.mkdir(exist_ok=True)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", str(run_name))[:64]
    backup = hist / f"{target.stem}-{stamp}-before-{safe}.py"
    with open(target, "rb") as src:
        atomic_write_with(backup, lambda fh: shutil.copyfileobj(src, fh))
    return backup
