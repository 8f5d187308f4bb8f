"""Orchestration of one `evolve run`: engine + run directory + signals + write-back.

Reliability contract (docs/reliability.md; tests/test_config_errors.py,
tests/test_interrupts.py, tests/test_crash_safety.py, tests/test_resume.py):
- ``prepare`` validates every option, the runs directory and a resumed run's
  files before anything is created; errors are one-line RunError/ConfigError.
- SIGINT/SIGTERM finish the current generation, save, and return exit code 130
  with the exact resume command; a second signal exits at once.
- A write error (disk full) ends the run with RunError; the last checkpoint,
  written atomically, stays intact.
- A run killed at any moment resumes: without a checkpoint it starts over from
  the seed, otherwise it restores the checkpoint and drops later history lines.
"""

from __future__ import annotations

import os
import shlex
import signal
from dataclasses import dataclass
from pathlib import Path

from evolve.lang import codegen, treeio
from evolve.objectives.settings import champion_settings
from evolve.runs import datasum
from evolve.runs.finalise import champion_record, finalise
from evolve.io.paths import runs_dir
from evolve.runs.rundir import RunDir, RunError, check_name, default_name, now_iso
from evolve.search.config import Config, ConfigError, show
from evolve.search.engine import Evolution
from evolve.search.operators import fewer_collections
from evolve.tasks import Finished, task_of
from evolve.runs import schema
from evolve.cluster import ClusterError, ClusterInterrupted
from evolve.cluster.session import Session
from evolve.kernels.gpu import DeviceError

EXIT_INTERRUPTED = 130


@dataclass
class RunOptions:
    config: Config
    data_dir: Path
    runs_parent: Path
    name: str | None = None
    resume: str | None = None
    writeback: bool = True
    force: bool = False
    heuristics_dir: Path | None = None
    data_given: bool = False      # --data was on the command line (on --resume: checked)
    cluster: str | None = None       # execution only (not results): local:N workers
    scheduler: str | None = None     # or the address of an existing Dask scheduler

    def __post_init__(self):
        """Every option's type (the Python API passes on what its caller gave) and a
        new run's configuration are checked here, before anything is made; a
        resumed run's configuration is checked once read back (``prepare``)."""
        def need(ok, param, what):
            if not ok:
                raise ConfigError.of(param, f"{show(getattr(self, param))} is invalid; "
                                            f"expected {what}")
        need(isinstance(self.config, Config), "config", "a Config")
        for param in ("writeback", "force", "data_given"):
            need(isinstance(getattr(self, param), bool), param, "True or False")
        for param in ("name", "resume", "cluster", "scheduler"):
            need(getattr(self, param) is None or isinstance(getattr(self, param), str), param,
                 "a string or None")
        for param in ("data_dir", "runs_parent", "heuristics_dir"):
            value = getattr(self, param)
            if value is None and param == "heuristics_dir":
                continue
            need(isinstance(value, (str, os.PathLike)) and isinstance(os.fspath(value), str),
                 param, "a path")
            setattr(self, param, Path(value))
        if self.resume is None:
            self.config.validate()


class StopRequested:
    """SIGINT/SIGTERM: the first asks to stop after the current generation, the
    second exits at once (the last checkpoint is complete on disk either way)."""

    def __init__(self, term):
        self.term = term
        self.requested = False
        self.signal_name = ""
        self._old = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def _handle(self, signum, frame):
        if self.requested:
            os.write(2, b"\nsecond interrupt: exiting now; the last checkpoint is intact\n")
            os._exit(EXIT_INTERRUPTED)
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        os.write(2, b"\ninterrupt: finishing the current generation, then saving "
                    b"(press Ctrl-C again to exit at once)\n")


def check_writable(parent: Path) -> None:
    """The runs directory exists or can be made, and we may create entries in it.
    Creates nothing: RunDir.create makes it once everything else has been checked."""
    parent = Path(parent)
    if parent.exists() and not parent.is_dir():
        raise RunError.of("runs_dir", f"{parent}: exists and is not a directory")
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent          # nearest existing ancestor: mkdir needs to write there
    if not probe.is_dir():
        raise RunError.of("runs_dir", f"{parent}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise RunError.of("runs_dir", f"{parent}: not writable")


def load_run_splits(cfg: Config, data_dir: Path, session=None) -> dict:
    """The splits a run evolves on, loaded and checked by its objective's task
    (sharded traces are evaluated through ``session``, in-process by default)."""
    return task_of(cfg.objective).load_splits(cfg, data_dir, session)


def prepare(opts: RunOptions, session=None):
    """Validate everything and load data before any work; returns (run, splits, engine, state).

    Nothing is created or changed on disk until every check has passed.
    """
    if opts.resume is not None:            # an empty name is an error, not "no resume"
        return _prepare_resume(opts, session)
    opts.config.validate()
    name = check_name(opts.name) if opts.name is not None else default_name(opts.config.seed)
    check_writable(opts.runs_parent)
    if os.path.lexists(opts.runs_parent / name):
        raise RunError(f"{opts.runs_parent / name}: a run of that name exists "
                       f"(use --resume {name} or another --name)")
    check_resume_fits(opts, name)
    splits = load_run_splits(opts.config, opts.data_dir, session)
    engine = Evolution(opts.config, splits["train"], splits["valid"])
    run = RunDir.create(opts.runs_parent, name, opts.config.to_dict(), {
        "dir": str(opts.data_dir.resolve()),
        "tokens": {k: len(v) for k, v in splits.items()},
        "sha256": datasum.digests(splits),
    })
    return run, splits, engine, opts.data_dir


def check_resume_fits(opts: RunOptions, name: str) -> None:
    """The resume command the run would print is one its own reader accepts
    (``schema.check_resume_command``, which bounds its length): checked at the start."""
    cmd = resume_command(opts, name)
    try:
        schema.check_resume_command(cmd, "summary.json", name)
    except schema.SchemaError:
        raise RunError.of("runs_dir", f"{show(str(opts.runs_parent))}: the command that "
                          f"resumes run {name} would be {len(cmd)} characters, more than a "
                          f"run's summary may hold ({schema.MAX_RESUME_CHARS}); use a shorter "
                          "--runs-dir, --cluster or --scheduler") from None


def _prepare_resume(opts: RunOptions, session=None):
    if not isinstance(opts.resume, str) or not opts.resume.strip():
        raise RunError.of("resume", f"{opts.resume!r} is not a run name")
    try:
        run = RunDir.open(opts.runs_parent, opts.resume)
    except RunError as e:
        raise RunError.of("resume", f"{opts.resume!r}: {e}") from None
    check_resume_fits(opts, run.name)
    run.lock()          # held until the run ends: a live run owns its directory
    try:
        return _prepare_locked(opts, run, session)
    except BaseException:
        run.unlock()
        raise


def _prepare_locked(opts: RunOptions, run: RunDir, session=None):
    meta = run.meta()
    state = run.checkpoint() if run.has_checkpoint() else None   # None: killed before gen 0 was saved
    try:
        cfg = Config.from_dict(meta["config"])
    except (ConfigError, TypeError) as e:
        raise RunError(f"{run.file('config.json')}: bad config ({e})") from None
    if opts.config.generations is not None:      # None: keep the run's own
        cfg.generations = opts.config.generations
        cfg.validate()
    cfg.device = opts.config.device     # not part of a run's identity: resumes on any device
    cfg.validate()
    at = state["generation"] if state else -1
    if isinstance(at, int) and cfg.generations < at:
        raise ConfigError.of("generations", f"{cfg.generations!r} is invalid; the run is "
                             f"already at generation {at}")
    data_dir = Path(meta.get("data", {}).get("dir") or opts.data_dir)
    if opts.data_given and Path(opts.data_dir).resolve() != data_dir.resolve():
        raise RunError.of("data_dir", f"{str(opts.data_dir)!r} cannot be changed on "
                          f"--resume (run {run.name} evolves on {data_dir})")
    opts.data_dir = data_dir          # what the run and its final report use
    splits = load_run_splits(cfg, data_dir, session)
    changed = datasum.changed_split(meta.get("data", {}).get("sha256") or {}, splits)
    if changed:
        raise RunError.of("resume", f"split '{changed}' in {data_dir} has changed since run "
                          f"{run.name} started (its sha256 differs from the one in "
                          f"{run.file('config.json')}); resume on the data the run started on")
    engine = Evolution(cfg, splits["train"], splits["valid"])
    if state is not None:
        try:
            engine.restore(state)
        except (treeio.TreeError, KeyError, TypeError, ValueError) as e:
            if isinstance(e, ClusterError):      # the cluster failed, not the checkpoint
                raise
            raise RunError(f"{run.file('checkpoint.json')}: cannot restore ({e})") from None
    check_writable(opts.runs_parent)
    run.remove_stale_temporaries()
    if cfg.to_dict() != meta["config"]:
        run.update_config(cfg.to_dict())
    run.truncate_history(engine.generation)
    return run, splits, engine, data_dir


def resume_command(opts: RunOptions, run: RunDir | str) -> str:
    """The exact command that continues this run (``run``: the run or its name)."""
    parts = ["evolve", "run", "--resume", run if isinstance(run, str) else run.name]
    if Path(opts.runs_parent).resolve() != runs_dir(None).resolve():
        parts += ["--runs-dir", str(opts.runs_parent)]
    if not opts.writeback:
        parts.append("--no-writeback")
    if opts.force:
        parts.append("--force")
    for opt, value in (("--cluster", opts.cluster), ("--scheduler", opts.scheduler)):
        if value:
            parts += [opt, value]
    if opts.config.device != "cpu":
        parts += ["--device", opts.config.device]
    return " ".join(shlex.quote(p) for p in parts)


def execute(opts: RunOptions, term) -> tuple[int, dict]:
    """Run (or resume) evolution; returns (exit code, result dict). Several starts
    (``--starts``) are run by ``evolve.runs.multistart.execute_any``."""
    with StopRequested(term) as stop, Session(opts.cluster, opts.scheduler,
                                              opts.config.threads or 0,
                                              stop=lambda: stop.requested) as session:
        try:
            run, splits, engine, data_dir = prepare(opts, session)
        except ClusterInterrupted:
            raise           # a stop while reaching the cluster: nothing was made (exit 130)
        except ClusterError as e:
            raise RunError(str(e)) from None
        try:
            return _evolve(opts, term, stop, run, splits, engine)
        finally:
            run.unlock()


def _evolve(opts: RunOptions, term, stop, run: RunDir, splits, engine) -> tuple[int, dict]:
    cfg = engine.config
    resumed = engine.generation >= 0
    saved = engine.generation          # the last generation on disk
    try:
        with term.progress(cfg.generations, start=max(engine.generation, 0)) as bar, \
                fewer_collections():
            if not resumed:
                rec = engine.initialise()
                _save_generation(run, engine, rec)
                saved = rec["generation"]
                bar.update(rec)
            while engine.generation < cfg.generations and not stop.requested:
                rec = engine.step()
                _save_generation(run, engine, rec)
                saved = rec["generation"]
                bar.update(rec)
        if stop.requested and engine.generation < cfg.generations:
            summary = {"status": "interrupted", "signal": stop.signal_name,
                       "generation": engine.generation,
                       "resume": resume_command(opts, run), "ended": now_iso()}
            run.write_json("summary.json", summary)
            return EXIT_INTERRUPTED, {"run": run.name, "path": str(run.path), **summary}
        # A signal from here on is noted and ignored (a second one exits at once):
        # finishing takes seconds and every file it writes is atomic.
        return 0, finish(run, engine, splits, opts, term)
    except ClusterInterrupted:
        # stopped while a generation on the cluster did not finish within the stop
        # grace: it is abandoned, the run stops at its last checkpoint
        summary = {"status": "interrupted", "signal": stop.signal_name,
                   "generation": saved if saved >= 0 else None,
                   "resume": resume_command(opts, run), "ended": now_iso()}
        run.write_json("summary.json", summary)
        return EXIT_INTERRUPTED, {"run": run.name, "path": str(run.path), **summary}
    except (ClusterError, DeviceError) as e:     # DeviceError: out of device memory
        _try_summary(run, {"status": "failed", "generation": engine.generation,
                           "error": str(e), "ended": now_iso()})
        raise RunError(f"{e} at generation {engine.generation + 1}; the last good "
                       f"checkpoint is kept; resume with: {resume_command(opts, run)}"
                       ) from None
    except OSError as e:
        what = f"{e.strerror or e}" + (f": {e.filename}" if getattr(e, "filename", None)
                                       else "")
        _try_summary(run, {"status": "failed", "generation": engine.generation,
                           "error": what, "ended": now_iso()})
        raise RunError(f"{run.path}: write failed at generation {engine.generation} "
                       f"({what}); the last good checkpoint is kept; resume with: "
                       f"{resume_command(opts, run)}") from None


def _save_generation(run: RunDir, engine: Evolution, rec: dict) -> None:
    run.append_history(rec)
    if rec["generation"] % engine.config.checkpoint_every == 0 or \
            rec["generation"] == engine.config.generations:
        run.write_checkpoint(engine.state())


def _try_summary(run: RunDir, summary: dict) -> None:
    try:
        run.write_json("summary.json", summary)
    except OSError:
        pass


def finish(run: RunDir, engine: Evolution, splits, opts: RunOptions, term) -> dict:
    """Champion on valid, its metrics on every split (test once), the task's report,
    then ``finalise`` (pictures are drawn later, by `evolve inspect`)."""
    objective, task = engine.objective, task_of(engine.objective)
    term.step("scoring the champion on train, valid and test, and writing the report ...")
    champ = engine.champion()
    nodes = treeio.parse(champ.tree)
    hof_trees = [e.tree for e in engine.hof.entries]
    hof_valid = engine.valid_scores(hof_trees)
    run.write_json("hall_of_fame.json", [
        {"tree": e.tree, "expression": codegen.infix(treeio.parse(e.tree)), "size": e.size,
         "born": e.born, "train_fitness": e.fitness, "valid_fitness": float(v)}
        for e, v in zip(engine.hof.entries, hof_valid)])
    evaluators = {"train": engine.train, "valid": engine.valid}
    metrics = objective.metrics(nodes, {k: splits[k] for k in ("train", "valid", "test")},
                                evaluators)
    rep = task.report(Finished(engine.config, splits, evaluators, nodes, metrics, hof_trees,
                               engine.population))
    for name, doc in rep["files"].items():
        run.write_json(name, doc)
    champion = champion_record(champ.tree, nodes, champ.born, objective.name, metrics,
                               champion_settings(objective, engine.config), **rep["champion"])
    wb = finalise(run, engine.config, opts, champion, engine.config.seed,
                  lambda: splits["valid"], {"generation": engine.generation},
                  evaluator=engine.valid)
    return {"run": run.name, "path": str(run.path), "champion": champion,
            "writeback": wb, "status": "finished"}
