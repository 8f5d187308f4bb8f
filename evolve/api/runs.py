"""Runs from Python: ``evolve.run`` and ``evolve.load_run``, the front door `evolve run`
goes through too.

    import evolve
    result = evolve.run(generations=50, population=500, seed=1, writeback=False)
    print(result.rule, result.rule.metrics["valid"])
    again = evolve.load_run(result.path)          # any run directory, read back

``run`` takes every option of ``evolve run`` as a keyword (``objective``,
``tv_budget``, ``seed_baselines``, ...: the fields of ``evolve.search.config.Config``,
whose declarations give its signature and the list of them in its docstring) plus
``data_dir``, ``runs_dir``, ``name``, ``resume``,
``writeback``, ``force``, ``engine`` (only the inputs that engine's export computes),
``cluster``/``scheduler`` (sharded traces scored by Dask) and ``progress`` (a callable
taking each generation's history record). It raises the same one-line errors the
command line prints (ConfigError, DataError, RunError), each naming the parameter,
and returns a ``RunResult``. Every argument is checked before anything is made on
disk: whole numbers must be ``int`` (not ``bool``, ``float`` or ``str``), numbers
finite, ``writeback``, ``force`` and ``seed_baselines`` ``bool``, each within the range
the command line accepts (``tournament: 2.5 is invalid; expected a whole number``). On
``resume`` only ``generations`` may be given, and ``device`` (``"cpu"``, the default, or
``"cuda"``: the torch kernels of ``evolve.kernels.gpu``, the same results bit for bit),
which is not part of a run's identity.
"""

from __future__ import annotations

import inspect
import os
import textwrap
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from evolve.api.acceptance_rule import Rule
from evolve.io import paths
from evolve.runs import multistart, runner
from evolve.runs.lifecycle import OVERRIDES
from evolve.runs.rundir import RunDir, RunError
from evolve.search.config import Config, ConfigError, show

# What may still be given when a run is resumed: the rest is the run's own.
ON_RESUME = OVERRIDES


@dataclass(frozen=True)
class RunResult:
    """A run directory as read back: its ``name`` and ``path``; ``status`` (from
    ``summary.json``: finished, interrupted, ...); ``champion`` (``champion.json``:
    expression, tree and metrics per split; None before a run has one) and ``rule``,
    the same champion as a ``Rule`` (threshold, sympy, numpy and torch forms; None
    before a run has one); ``history`` (``history.jsonl``, one record per generation);
    the resolved ``config``; and ``writeback``, what write-back did (None when it was
    skipped)."""
    name: str
    path: Path
    status: str                 # finished / interrupted / ... (summary.json)
    champion: dict | None       # champion.json (expression, tree, metrics per split)
    history: list               # history.jsonl, one record per generation
    config: dict                # the resolved configuration
    writeback: dict | None = None

    @property
    def rule(self) -> Rule | None:
        """The champion as a ``Rule`` (None before the run has one)."""
        return None if self.champion is None else Rule.from_champion(
            self.champion, name=f"run {self.name}")


class Quiet:
    """The runner's terminal interface, silent unless ``progress`` is given."""

    def __init__(self, progress=None):
        self._progress = progress

    def note(self, text: str) -> None:
        pass

    def step(self, text: str) -> None:
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


def _path(param: str, value) -> None:
    if value is not None and not (isinstance(value, (str, os.PathLike))
                                  and isinstance(os.fspath(value), str)):
        raise ConfigError.of(param, f"{show(value)} is invalid; expected a path")
    if value is not None and not str(value).strip():
        raise RunError.of(param, "an empty value is not allowed")


def run_options(*, data_dir=None, runs_dir=None, name=None, resume=None, writeback=True,
                force=False, engine=None, cluster=None, scheduler=None,
                **options) -> runner.RunOptions:
    """The checked options of a run (``evolve.runs.runner.RunOptions``) from the keywords
    of ``run``: every rule of what may be given is here, for the command line and the
    Python API alike; nothing is made on disk."""
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: not an option of evolve.run (options: "
                          f"{', '.join(sorted(known))})")
    for param, value in (("data_dir", data_dir), ("runs_dir", runs_dir)):
        _path(param, value)
    for param, value in (("name", name), ("resume", resume)):
        if value is not None and isinstance(value, str) and not value.strip():
            raise RunError.of(param, "an empty value is not allowed")
    if resume is not None:
        fixed = sorted(set(options) - set(ON_RESUME)) + (["name"] if name is not None else [])
        if engine is not None:
            fixed.append("engine")
        if fixed:
            raise ConfigError.of(fixed[0], "cannot be changed on resume (only "
                                           f"{' and '.join(ON_RESUME)})")
    if engine is not None:
        from evolve.export import engines    # lazy: only a run limited to an engine reads it
        if "inputs" in options:
            raise ConfigError.of("engine", "give engine or inputs, not both")
        if engine not in engines.ENGINE_FORMATS:
            raise ConfigError.of("engine", f"{show(engine)} is invalid; expected one of "
                                           f"{', '.join(engines.ENGINE_FORMATS)}")
        options["inputs"] = engines.engine_inputs(engine, options.get("objective",
                                                                      Config.objective),
                                                  bool(options.get("lookahead")))
    if "ess_floor" in options and not options.get("trajectory"):
        raise ConfigError.of("ess_floor", "only with trajectory (it is the floor of the "
                                          "trajectory estimate's effective sequences; "
                                          "without it nothing reads it)")
    from evolve.cluster.session import check_options    # lazy: Dask loads only when asked
    check_options(cluster, scheduler)       # before anything is made (starts included)
    cfg = Config(**options)
    if resume is not None and "generations" not in options:
        cfg.generations = None              # keep the run's own
    # data_dir None: the objective's own data (evolve.runs.lifecycle.begin)
    return runner.RunOptions(config=cfg, data_dir=data_dir,          # checks every value
                             runs_parent=paths.runs_dir(runs_dir), name=name, resume=resume,
                             writeback=writeback, force=force, data_given=data_dir is not None,
                             cluster=cluster, scheduler=scheduler)


def execute(term, **keywords) -> tuple[int, dict, runner.RunOptions]:
    """Run (or resume) the run ``keywords`` ask for (those of ``run``, checked by
    ``run_options``) with ``term`` (the command line's terminal, or ``Quiet``): (exit
    code, the runner's result, the options as run: ``data_dir`` is the data it read)."""
    opts = run_options(**keywords)
    return (*multistart.execute_any(opts, term), opts)


def run(*, data_dir=None, runs_dir=None, name=None, resume=None, writeback=True, force=False,
        progress=None, engine=None, cluster=None, scheduler=None, **options) -> RunResult:
    """Evolve (or resume) a run; see the module docstring. Every argument is type- and
    range-checked (``run_options``: ``Config.validate``, ``RunOptions``) before anything
    is made."""
    if progress is not None and not callable(progress):
        raise ConfigError.of("progress", f"{show(progress)} is invalid; expected a callable "
                                         "taking each generation's record, or None")
    _, result, _ = execute(Quiet(progress), data_dir=data_dir, runs_dir=runs_dir, name=name,
                           resume=resume, writeback=writeback, force=force, engine=engine,
                           cluster=cluster, scheduler=scheduler, **options)
    out = load_run(result["path"])
    return RunResult(out.name, out.path, out.status, out.champion, out.history, out.config,
                     result.get("writeback"))


def _options_signature(fn) -> inspect.Signature:
    """``fn``'s signature with ``**options`` spelled out: every field of ``Config`` as a
    keyword with its default (what ``inspect.signature(evolve.run)`` and ``help`` show)."""
    sig = inspect.signature(fn)
    named = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    taken = {p.name for p in named}
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                 annotation=f.type)
               for f in fields(Config) if f.default is not MISSING and f.name not in taken]
    return sig.replace(parameters=named + options)


def _options_doc() -> str:
    """The search options of ``run``, each with its default and help, from ``Config``."""
    lines = ["", "Search options: the fields of ``evolve.search.config.Config``, each",
             "declared once there or, for an objective's settings, by the objective that",
             "reads it (``evolve.objectives.settings``):", ""]
    for f in fields(Config):
        lines += textwrap.wrap(f"``{f.name}={f.default!r}``: {Config.help_of(f.name, False)}",
                               84, initial_indent="- ", subsequent_indent="  ")
    return "\n".join("    " + line if line else "" for line in lines)


run.__signature__ = _options_signature(run)
run.__doc__ = (run.__doc__ or "") + "\n" + _options_doc()


def load_run(path) -> RunResult:
    """A run directory read back (every file validated; nothing in it is executed).
    ``path``: a str or path-like; anything else is a one-line RunError."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise RunError.of("path", f"{show(path)} is invalid; expected the path of a run "
                          "directory (a str or a path-like object)")
    p = Path(path)
    rd = RunDir.open(p.parent, str(p))
    try:
        champion = rd.champion()
    except RunError:
        champion = None
    summary = rd.summary()
    return RunResult(rd.name, rd.path, summary.get("status", "running or killed"),
                     champion, rd.history(), rd.meta()["config"], summary.get("writeback"))
