"""Orchestration of one `evolve run`: engine + run directory + signals + write-back.

Reliability contract (docs/reliability.md; tests/test_config_errors.py,
tests/test_interrupts.py, tests/test_crash_safety.py, tests/test_resume.py):
- every option, the runs directory, the data and a resumed run's files are checked
  before anything is created (``evolve.runs.lifecycle``, the one way a run directory
  is opened); errors are one-line RunError/ConfigError.
- SIGINT/SIGTERM finish the current generation, save, and return exit code 130
  with the exact resume command; a second signal exits at once.
- A write error (disk full) ends the run with RunError; the last checkpoint,
  written atomically, stays intact.
- A run killed at any moment resumes: without a checkpoint it starts over from
  the seed, otherwise it restores the checkpoint and drops later history lines.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from evolve import errors
from evolve.lang import codegen, treeio
from evolve.objectives.settings import champion_settings
from evolve.runs import lifecycle
from evolve.runs.finalise import champion_record, finalise
from evolve.runs.lifecycle import resume_command
from evolve.runs.rundir import RunDir, RunError, now_iso
from evolve.search.config import Config, ConfigError, show
from evolve.search.engine import Evolution
from evolve.search.operators import fewer_collections
from evolve.tasks import Finished, task_of
from evolve.cluster import ClusterError, ClusterInterrupted
from evolve.cluster.session import Session
from evolve.kernels.gpu import DeviceError

EXIT_INTERRUPTED = errors.EXIT_INTERRUPTED       # 130, as every interrupted command


@dataclass
class RunOptions:
    config: Config
    data_dir: Path | None          # None: the objective's default (lifecycle.begin)
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
            if value is None and param != "runs_parent":   # data_dir: the task's default
                continue
            need(isinstance(value, (str, os.PathLike)) and isinstance(os.fspath(value), str),
                 param, "a path")
            setattr(self, param, Path(value))
        if self.resume is None:
            self.config.validate()      # once: a resumed run's, once read (lifecycle)


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


def execute(opts: RunOptions, term, begun: lifecycle.Begun | None = None) -> tuple[int, dict]:
    """Run (or resume) evolution; returns (exit code, result dict). ``begun``: the run
    as ``lifecycle.begin`` opened it (``evolve.runs.multistart.execute_any``, which runs
    several starts, ``--starts``, itself); opened here when not given."""
    if begun is None:
        with lifecycle.begin(opts) as begun:
            return execute(opts, term, begun)
    with StopRequested(term) as stop, Session(opts.cluster, opts.scheduler,
                                              opts.config.threads or 0,
                                              stop=lambda: stop.requested) as session:
        try:
            splits, engine = begun.complete(session, lambda cfg, splits: Evolution(
                cfg, splits["train"], splits["valid"]))
        except ClusterInterrupted:
            raise           # a stop while reaching the cluster: nothing was made (exit 130)
        except ClusterError as e:
            raise RunError(str(e)) from None
        if begun.meta is not None:
            begun.run.truncate_history(engine.generation)
        return _evolve(opts, term, stop, begun.run, splits, engine)


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
    tree, born = champ.tree, champ.born
    hof_trees = [e.tree for e in engine.hof.entries]
    hof_valid = engine.valid_scores(hof_trees)
    run.write_json("hall_of_fame.json", [
        {"tree": e.tree, "expression": codegen.infix(treeio.parse(e.tree)), "size": e.size,
         "born": e.born, "train_fitness": e.fitness, "valid_fitness": float(v)}
        for e, v in zip(engine.hof.entries, hof_valid)])
    evaluators = {"train": engine.train, "valid": engine.valid}
    # the world's own choice (the task world's, free-running on valid), from the hall of
    # fame ranked on train: its rule becomes the champion
    # (candidates: the champion chosen on valid, then the hall of fame)
    selection = task.select(Finished(engine.config, splits, evaluators, None, None,
                                     [tree] + hof_trees, engine.population), term.step)
    if selection is not None:
        source = selection.get("source_tree")
        born = next((e.born for e in engine.hof.entries if e.tree == source),
                    born if source == tree else 0)
        tree = selection["tree"]
    nodes = treeio.parse(tree)
    metrics = objective.metrics(nodes, {k: splits[k] for k in ("train", "valid", "test")},
                                evaluators)
    rep = task.report(Finished(engine.config, splits, evaluators, nodes, metrics, hof_trees,
                               engine.population, selection))
    for name, doc in rep["files"].items():
        run.write_json(name, doc)
    extra = dict(rep["champion"], **({"selection": selection} if selection else {}))
    champion = champion_record(tree, nodes, born, objective.name, metrics,
                               champion_settings(objective, engine.config), **extra)
    wb = finalise(run, engine.config, opts, champion, engine.config.seed,
                  lambda: splits["valid"], {"generation": engine.generation},
                  evaluator=engine.valid)
    return {"run": run.name, "path": str(run.path), "champion": champion,
            "writeback": wb, "status": "finished"}
