"""One lifecycle for every run directory: open, lock, read the configuration, override
what a resume may change, validate once, check the data, write.

A single run (``evolve.runs.runner``), a resumed one and the parent directory of a run of
several starts (``evolve.runs.multistart``) all open their directory here, so they check
and record the same things, the digests of their data included:

1. ``begin(opts)``: a new run's name, runs directory and resume command are checked (its
   configuration was validated once, when its options were made: ``RunOptions``); a
   resumed run is opened and locked (until the run ends), its configuration read,
   ``generations`` and ``device`` overridden, then validated, once. Either way the
   configuration is known here, so the caller chooses a single run or several starts
   without opening the run again.
2. ``Begun.complete(session, prepare)``: the data loaded and checked by the objective's
   task (``--data``, or the task's default; on resume the directory the run began on,
   whose digests must be the recorded ones), ``prepare(config, splits)`` run (the
   runner builds its engine there, which checks the device, and a resumed engine is
   restored from the checkpoint), and only then the directory written: a new run
   created (and locked), a resumed one's configuration updated when overridden.

Nothing is created or changed on disk until every check has passed. ``Begun`` is a
context manager: leaving it unlocks the run directory.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from evolve.cluster import ClusterError
from evolve.data import datasum
from evolve.io.paths import check_creatable, runs_dir
from evolve.lang import treeio
from evolve.runs import schema
from evolve.runs.rundir import RunDir, RunError, check_name, default_name
from evolve.search.config import Config, ConfigError, show
from evolve.tasks import task_of

# What a resume may change: the rest is the run's own.
OVERRIDES = ("generations", "device")


def check_writable(parent: Path) -> None:
    """The runs directory exists or can be made, and we may create entries in it.
    Creates nothing: RunDir.create makes it once everything else has been checked."""
    check_creatable(parent, "runs_dir", RunError)


def resume_command(opts, run: RunDir | str) -> str:
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


def check_resume_fits(opts, name: str) -> None:
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


def load_splits(config: Config, data_dir: Path, session=None) -> dict:
    """The splits a run evolves on, loaded and checked by its objective's task (sharded
    traces are evaluated through ``session``, in-process by default)."""
    return task_of(config.objective).load_splits(config, data_dir, session)


@dataclass
class Begun:
    """A run directory on its way to being run: ``config`` (validated), ``name``,
    ``data_dir``; on resume ``run`` (opened and locked), ``meta`` (its config.json as
    read) and ``state`` (the checkpoint to continue from, None when the run was killed
    before its first one). ``complete`` checks the data and writes; leaving the
    context unlocks ``run``."""
    opts: object
    config: Config
    name: str
    data_dir: Path
    run: RunDir | None = None
    meta: dict | None = None
    state: dict | None = None

    def __enter__(self) -> "Begun":
        return self

    def __exit__(self, *exc) -> bool:
        if self.run is not None:
            self.run.unlock()
        return False

    def complete(self, session=None, prepare=None):
        """Check the data (loaded through ``session``; their digests), ``prepare(config,
        splits)`` (what the run needs before anything is written: the runner's engine,
        restored from the checkpoint on resume; a run of several starts checks its
        device there), then write the run directory (created, or its configuration
        updated). Returns (splits, what ``prepare`` returned)."""
        cfg = self.config
        splits = load_splits(cfg, self.data_dir, session)
        if self.meta is None:
            digests = datasum.digests(splits)          # recorded: a resume compares them
        else:
            changed = datasum.changed_split(self.meta.get("data", {}).get("sha256") or {},
                                            splits)
            if changed:
                raise RunError.of("resume", f"split '{changed}' in {self.data_dir} has changed "
                                  f"since run {self.name} started (its sha256 differs from "
                                  f"the one in {self.run.file('config.json')}); resume on "
                                  "the data the run started on")
        prepared = prepare(cfg, splits) if prepare is not None else None
        if self.state is not None:
            self._restore(prepared)
        if self.meta is None:
            self.run = RunDir.create(self.opts.runs_parent, self.name, cfg.to_dict(), {
                "dir": str(Path(self.data_dir).resolve()),
                "tokens": {k: len(v) for k, v in splits.items()},
                "sha256": digests,
            })
        else:
            check_writable(self.opts.runs_parent)
            self.run.remove_stale_temporaries()
            if cfg.to_dict() != self.meta["config"]:
                self.run.update_config(cfg.to_dict())
        return splits, prepared

    def _restore(self, engine) -> None:
        """The engine continues from the run's checkpoint (before anything is written: a
        checkpoint that cannot be restored leaves the run's files as they were)."""
        try:
            engine.restore(self.state)
        except (treeio.TreeError, KeyError, TypeError, ValueError) as e:
            if isinstance(e, ClusterError):      # the cluster failed, not the checkpoint
                raise
            raise RunError(f"{self.run.file('checkpoint.json')}: cannot restore ({e})"
                           ) from None


def begin(opts) -> Begun:
    """Open the run ``opts`` asks for (``evolve.runs.runner.RunOptions``): see the module
    docstring. Nothing is written."""
    if opts.resume is None:
        cfg = opts.config
        name = check_name(opts.name) if opts.name is not None else default_name(cfg.seed)
        check_writable(opts.runs_parent)
        if os.path.lexists(opts.runs_parent / name):
            raise RunError(f"{opts.runs_parent / name}: a run of that name exists "
                           f"(use --resume {name} or another --name)")
        check_resume_fits(opts, name)
        if opts.data_dir is None:                 # the objective's own data
            opts.data_dir = Path(task_of(cfg.objective).default_data())
        return Begun(opts, cfg, name, Path(opts.data_dir))
    if not isinstance(opts.resume, str) or not opts.resume.strip():
        raise RunError.of("resume", f"{opts.resume!r} is not a run name")
    try:
        run = RunDir.open(opts.runs_parent, opts.resume)
    except RunError as e:
        raise RunError.of("resume", f"{opts.resume!r}: {e}") from None
    check_resume_fits(opts, run.name)
    run.lock()          # held until the run ends: a live run owns its directory
    try:
        return _reopen(opts, run)
    except BaseException:
        run.unlock()
        raise


def _reopen(opts, run: RunDir) -> Begun:
    """A locked run's configuration read, overridden and validated once; its data
    directory and checkpoint."""
    meta = run.meta()
    state = run.checkpoint() if run.has_checkpoint() else None   # None: killed before gen 0
    try:
        cfg = Config.from_dict(meta["config"], validate=False)     # types only
    except (ConfigError, TypeError) as e:
        raise RunError(f"{run.file('config.json')}: bad config ({e})") from None
    given = {"device": opts.config.device}
    if opts.config.generations is not None:      # None: keep the run's own
        given["generations"] = opts.config.generations
    for param, value in given.items():
        setattr(cfg, param, value)
    try:
        cfg.validate()                           # once: the run's values and the given
    except ConfigError as e:
        if e.param in given:
            raise
        raise RunError(f"{run.file('config.json')}: bad config ({e})") from None
    at = state["generation"] if state else -1
    if isinstance(at, int) and cfg.generations < at:
        raise ConfigError.of("generations", f"{cfg.generations!r} is invalid; the run is "
                             f"already at generation {at}")
    recorded = meta.get("data", {}).get("dir")
    data_dir = Path(recorded or opts.data_dir or task_of(cfg.objective).default_data())
    if opts.data_given and Path(opts.data_dir).resolve() != data_dir.resolve():
        raise RunError.of("data_dir", f"{str(opts.data_dir)!r} cannot be changed on "
                          f"--resume (run {run.name} evolves on {data_dir})")
    opts.data_dir = data_dir          # what the run and its final report use
    return Begun(opts, cfg, run.name, data_dir, run=run, meta=meta, state=state)
