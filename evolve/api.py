"""The Python API: script runs as DEAP, gplearn and PySR users do.

    import evolve
    result = evolve.run(generations=50, population=500, seed=1, writeback=False)
    print(result.champion["expression"], result.champion["metrics"]["valid"])
    again = evolve.load_run(result.path)          # any run directory, read back

``run`` takes every option of ``evolve run`` as a keyword (``objective``,
``tv_budget``, ``seed_baselines``, ...; see ``evolve.search.config.Config``) plus
``data_dir``, ``runs_dir``, ``name``, ``resume``, ``writeback``, ``force`` and
``progress`` (a callable taking each generation's history record). It raises
the same one-line errors the command line prints (ConfigError, DataError,
RunError), and returns a ``RunResult``. Every argument is checked before anything
is made on disk: whole numbers must be ``int`` (not ``bool``, ``float`` or ``str``),
numbers finite, ``writeback``, ``force`` and ``seed_baselines`` ``bool``, each within
the range the command line accepts; an error names the parameter (``tournament: 2.5
is invalid; expected a whole number``). On ``resume`` only ``generations`` may be
given, and ``device`` (``"cpu"``, the default, or ``"cuda"``: the torch kernels of
``evolve.kernels.gpu``, the same results bit for bit), which is not part of a run's
identity.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from evolve.runs import multistart, runner
from evolve.io import paths
from evolve.objectives import OBJECTIVES
from evolve.search.config import Config, ConfigError, show
from evolve.tasks import task_of
from evolve.runs.rundir import RunDir, RunError


@dataclass(frozen=True)
class RunResult:
    """A run directory as read back: its ``name`` and ``path``; ``status`` (from
    ``summary.json``: finished, interrupted, ...); ``champion`` (``champion.json``:
    expression, tree and metrics per split; None before a run has one);
    ``history`` (``history.jsonl``, one record per generation); the resolved
    ``config``; and ``writeback``, what write-back did (None when it was skipped)."""
    name: str
    path: Path
    status: str                 # finished / interrupted / ... (summary.json)
    champion: dict | None       # champion.json (expression, tree, metrics per split)
    history: list               # history.jsonl, one record per generation
    config: dict                # the resolved configuration
    writeback: dict | None = None


class _Quiet:
    """The runner's terminal interface, silent unless ``progress`` is given."""

    def __init__(self, progress=None):
        self._progress = progress

    def note(self, text: str) -> None:
        pass

    def progress(self, total: int, start: int = 0):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, record: dict) -> None:
        if self._progress is not None:
            self._progress(record)


def run(*, data_dir=None, runs_dir=None, name=None, resume=None, writeback=True, force=False,
        progress=None, **options) -> RunResult:
    """Evolve (or resume) a run; see the module docstring. Every argument is type- and
    range-checked (``Config.validate``, ``RunOptions``) before anything is made."""
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: not an option of evolve.run (options: "
                          f"{', '.join(sorted(known))})")
    if resume is not None:
        fixed = sorted(set(options) - {"generations", "device"})
        if fixed:
            raise ConfigError.of(fixed[0], "cannot be changed on resume (only generations "
                                           "and device)")
    for param, value in (("data_dir", data_dir), ("runs_dir", runs_dir)):
        if value is not None and not (isinstance(value, (str, os.PathLike))
                                      and isinstance(os.fspath(value), str)):
            raise ConfigError.of(param, f"{show(value)} is invalid; expected a path")
    if progress is not None and not callable(progress):
        raise ConfigError.of("progress", f"{show(progress)} is invalid; expected a callable "
                                         "taking each generation's record, or None")
    cfg = Config(**options)
    if resume is not None and "generations" not in options:
        cfg.generations = None
    if data_dir is None:
        known = isinstance(cfg.objective, str) and cfg.objective in OBJECTIVES
        data_dir = task_of(cfg.objective).default_data() if known else paths.DATA_DIR
    opts = runner.RunOptions(config=cfg, data_dir=data_dir,          # checks every value
                             runs_parent=paths.runs_dir(runs_dir), name=name, resume=resume,
                             writeback=writeback, force=force)
    _, result = multistart.execute_any(opts, _Quiet(progress))
    out = load_run(result["path"])
    return RunResult(out.name, out.path, out.status, out.champion, out.history, out.config,
                     result.get("writeback"))


def load_run(path) -> RunResult:
    """A run directory read back (every file validated; nothing in it is executed).
    ``path``: a str or path-like; anything else is a one-line RunError."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise RunError.of("path", f"{show(path)} is invalid; expected the path of a run "
                          "directory (a str or a path-like object)")
    p = Path(path)
    run = RunDir.open(p.parent, str(p))
    try:
        champion = run.champion()
    except RunError:
        champion = None
    summary = run.summary()
    return RunResult(run.name, run.path, summary.get("status", "running or killed"),
                     champion, run.history(), run.meta()["config"],
                     summary.get("writeback"))
