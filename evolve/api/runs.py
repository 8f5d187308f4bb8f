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
``cluster``/``scheduler`` (sharded traces scored by Dask), ``progress`` and
``on_generation``. ``progress`` says how the run goes, in the lines `evolve run` prints
when not on a terminal (the first and last generation, at most one every 2 s between:
best and median fitness, size, speed, ETA): None (the default) writes them to stderr
when it is a terminal and says nothing otherwise (a script's log stays clean); a
callable (``print``, ``logging.info``) is given each line; False says nothing.
``on_generation``, a callable, is given each generation's history record (a dict) as
it is written. It raises the same one-line errors the
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
import sys
import textwrap
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from evolve.api.acceptance_rule import Rule
from evolve.io import paths
from evolve.runs import multistart, runner
from evolve.runs import schema
from evolve.runs.lifecycle import OVERRIDES
from evolve.runs.rundir import RunDir, RunError, checked
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
    the resolved ``config``; ``writeback``, what write-back did (None when it was
    skipped); and ``hall_of_fame``, the best distinct trees found, one flat record
    each (``hall_of_fame_rows``; a table: ``pandas.DataFrame(result.hall_of_fame)``,
    as PySR's ``equations_``)."""
    name: str
    path: Path
    status: str                 # finished / interrupted / ... (summary.json)
    champion: dict | None       # champion.json (expression, tree, metrics per split)
    history: list               # history.jsonl, one record per generation
    config: dict                # the resolved configuration
    writeback: dict | None = None
    hall_of_fame: list = field(default_factory=list)   # hall_of_fame_rows

    @property
    def rule(self) -> Rule | None:
        """The champion as a ``Rule`` (None before the run has one)."""
        return None if self.champion is None else Rule.from_champion(
            self.champion, name=f"run {self.name}")


def hall_of_fame_rows(hof: list | None, pareto: dict | None, champion: dict | None) -> list:
    """The hall of fame as flat records, best on train first (``hall_of_fame.json``):
    ``formula`` (infix, inputs by their short names), ``tree``, ``size`` (nodes: the
    complexity), ``generation`` (when it was found), ``train_fitness`` and
    ``valid_fitness`` (the score the run maximises); on traces also
    ``valid_tokens_per_call`` and ``valid_tv_per_token`` (``pareto.json``); ``champion``
    (whether it is the run's champion) and ``standing`` (the champion's verdict, wins,
    loses or infeasible, ``evolve.standing``; None for the others, which are not
    judged)."""
    if not hof:
        return []
    valid = {e["tree"]: e for e in (pareto or {}).get("hall_of_fame", [])}
    champ_tree = (champion or {}).get("tree")
    verdict = ((champion or {}).get("standing") or {}).get("verdict")
    rows = []
    for e in hof:
        row = {"formula": e["expression"], "tree": e["tree"], "size": e["size"],
               "generation": e["born"], "train_fitness": e["train_fitness"],
               "valid_fitness": e["valid_fitness"]}
        if valid:
            v = valid.get(e["tree"], {})
            row["valid_tokens_per_call"] = v.get("tokens_per_call")
            row["valid_tv_per_token"] = v.get("tv_per_token")
        row["champion"] = e["tree"] == champ_tree
        row["standing"] = verdict if row["champion"] else None
        rows.append(row)
    return rows


class Quiet:
    """The runner's terminal interface for the Python API: lines of progress for
    ``progress`` (a callable; ``evolve.api.progress.GenerationLines``), each generation's
    record for ``on_generation``; nothing else is said."""

    def __init__(self, progress=None, on_generation=None):
        self._say, self._each = progress, on_generation

    def note(self, text: str) -> None:
        pass

    def step(self, text: str) -> None:
        pass

    def progress(self, total: int, start: int = 0):
        return _Generations(self._say, total, self._each)


class _Generations:
    def __init__(self, say, total: int, each):
        from evolve.api.progress import GenerationLines    # lazy: start-up
        self.lines = GenerationLines(say, total) if say is not None else None
        self.each = each

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, record: dict) -> None:
        if self.lines is not None:
            self.lines.update(record)
        if self.each is not None:
            self.each(record)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def terminal_of(progress, on_generation):
    """The runner's terminal for ``evolve.run``: progress lines to stderr when
    ``progress`` is None and stderr is a terminal, to ``progress`` when it is a callable,
    none when it is False. (The command line's live bar is the command line's: the API
    never imports ``evolve.cli``, which imports it.)"""
    if progress is None:
        progress = _stderr if sys.stderr.isatty() else None
    return Quiet(progress or None, on_generation)


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
        progress=None, on_generation=None, engine=None, cluster=None, scheduler=None,
        **options) -> RunResult:
    """Evolve (or resume) a run; see the module docstring. Every argument is type- and
    range-checked (``run_options``: ``Config.validate``, ``RunOptions``) before anything
    is made."""
    if not (progress is None or progress is False or callable(progress)):
        raise ConfigError.of("progress", f"{show(progress)} is invalid; expected a callable "
                                         "given lines of progress (print), None or False")
    if on_generation is not None and not callable(on_generation):
        raise ConfigError.of("on_generation", f"{show(on_generation)} is invalid; expected "
                                              "a callable taking each generation's record")
    _, result, _ = execute(terminal_of(progress, on_generation), data_dir=data_dir,
                           runs_dir=runs_dir, name=name, resume=resume, writeback=writeback,
                           force=force, engine=engine, cluster=cluster, scheduler=scheduler,
                           **options)
    return replace(load_run(result["path"]), writeback=result.get("writeback"))


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
    pareto = rd.pareto()
    if pareto is not None:
        checked(schema.check_pareto_hall_of_fame, pareto, str(rd.file("pareto.json")))
    return RunResult(rd.name, rd.path, summary.get("status", "running or killed"),
                     champion, rd.history(), rd.meta()["config"], summary.get("writeback"),
                     hall_of_fame_rows(rd.hall_of_fame(), pareto, champion))
