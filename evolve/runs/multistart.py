"""Several independent starts of one run, the champion chosen on valid only.

``evolve run --starts N`` runs the configuration N times with seeds seed,
seed + 1, ..., seed + N - 1, each a complete run directory under
``runs/<name>/starts/seed<k>/`` (resumable on its own, never written back).
The parent run directory ``runs/<name>/`` then holds the champion of the start
whose champion scores best on valid (the objective's own score: fitness on
token splits; tokens per call within the budget on traces; ties: smaller tree,
then lower seed), its ``champion.py`` and write-back, and in ``champion.json``
every start's champion with its valid and test metrics and the distribution of
the test figure over starts (median, min, max): test is never used to choose.
``evolve run --resume <name>`` continues the unfinished starts, then chooses.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from evolve.objectives import bind
from evolve.runs.finalise import finalise
from evolve.runs.rundir import RunDir, RunError, check_name, default_name, now_iso
from evolve.search.config import Config, ConfigError
from evolve.tasks import task_of
from evolve.runs import runner
from evolve.runs.runner import check_writable, load_run_splits
from evolve.kernels import gpu

STARTS_DIR = "starts"


def is_multistart(opts) -> bool:
    """Whether ``opts`` start or resume a run of several starts."""
    if opts.resume:
        try:
            meta = RunDir.open(opts.runs_parent, opts.resume).meta()
        except RunError:
            return False           # the runner reports it
        starts = meta["config"].get("starts", 1)
        return isinstance(starts, int) and starts > 1
    return opts.config.starts > 1


def execute_any(opts, term) -> tuple[int, dict]:
    """``runner.execute``, or ``execute`` for a run of several starts."""
    return execute(opts, term) if is_multistart(opts) else runner.execute(opts, term)


def _parent(opts):
    """(parent RunDir, config, data directory), created or opened; checks first."""
    if opts.resume:
        try:
            run = RunDir.open(opts.runs_parent, opts.resume)
        except RunError as e:
            raise RunError.of("resume", f"{opts.resume!r}: {e}") from None
        run.lock()                     # refused (one line) while another process runs it
        meta = run.meta()
        try:
            cfg = Config.from_dict(meta["config"])
        except (ConfigError, TypeError) as e:
            raise RunError(f"{run.file('config.json')}: bad config ({e})") from None
        cfg.device = opts.config.device     # not part of a run's identity
        cfg.validate()
        if opts.config.generations is not None:
            cfg.generations = opts.config.generations
            cfg.validate()
            if cfg.to_dict() != meta["config"]:
                run.update_config(cfg.to_dict())
        return run, cfg, Path(meta.get("data", {}).get("dir") or opts.data_dir)
    cfg = opts.config
    cfg.validate()
    if cfg.device != "cpu":                 # a device that cannot be used: nothing made
        gpu.torch_device(cfg.device)
    name = check_name(opts.name) if opts.name else default_name(cfg.seed)
    check_writable(opts.runs_parent)
    splits = load_run_splits(cfg, opts.data_dir)        # fail on bad data before creating
    run = RunDir.create(opts.runs_parent, name, cfg.to_dict(), {
        "dir": str(Path(opts.data_dir).resolve()),
        "tokens": {k: len(v) for k, v in splits.items()}})
    return run, cfg, Path(opts.data_dir)


def execute(opts, term) -> tuple[int, dict]:
    run, cfg, data_dir = _parent(opts)
    try:
        return _starts(opts, term, run, cfg, data_dir)
    finally:
        run.unlock()


def _starts(opts, term, run: RunDir, cfg: Config, data_dir: Path) -> tuple[int, dict]:
    children = run.path / STARTS_DIR
    records = []
    for i in range(cfg.starts):
        seed = cfg.seed + i
        name = f"seed{seed}"
        child = children / name
        done = child.is_dir() and RunDir(child).summary().get("status") == "finished"
        if not done:
            term.note(f"start {i + 1}/{cfg.starts}: seed {seed}")
            child_cfg = replace(cfg, seed=seed, starts=1)
            exists = child.is_dir()
            child_opts = runner.RunOptions(
                config=replace(child_cfg, generations=None) if exists and
                opts.config.generations is None else child_cfg,
                data_dir=data_dir, runs_parent=children, name=None if exists else name,
                resume=name if exists else None, writeback=False,
                cluster=opts.cluster, scheduler=opts.scheduler)
            code, res = runner.execute(child_opts, term)
            if code != 0:
                summary = {"status": "interrupted", "generation": res.get("generation"),
                           "start": seed, "resume": runner.resume_command(opts, run),
                           "ended": now_iso()}
                run.write_json("summary.json", summary)
                return code, {"run": run.name, "path": str(run.path), **summary}
        champ = RunDir(child).champion()
        records.append({"seed": seed, "run": f"{STARTS_DIR}/{name}", "tree": champ["tree"],
                        "expression": champ["expression"], "size": champ["size"],
                        "valid": champ["metrics"]["valid"], "test": champ["metrics"]["test"],
                        "champion": champ})
    return 0, _choose(run, cfg, data_dir, records, opts)


def _choose(run: RunDir, cfg: Config, data_dir: Path, records: list, opts) -> dict:
    objective, task = bind(cfg), task_of(cfg.objective)
    for r in records:
        r["valid_score"] = objective.split_score(r["valid"], cfg)
        r["test_score"] = objective.split_score(r["test"], cfg)
    best = max(records, key=lambda r: (r["valid_score"], -r["size"], -r["seed"]))
    values = [r["test"][task.figure] for r in records]
    champion = {**best["champion"], "starts": [{k: v for k, v in r.items() if k != "champion"}
                                               for r in records],
                "chosen_seed": best["seed"],
                "over_starts": {"figure": f"test {task.figure}",
                                "median": statistics.median(values),
                                "min": min(values), "max": max(values), "n": len(values)}}
    wb = finalise(run, cfg, opts, champion, best["seed"],
                  lambda: load_run_splits(cfg, data_dir)["valid"],
                  {"starts": cfg.starts, "chosen_seed": best["seed"]},
                  meta_extra={"starts": cfg.starts})
    return {"run": run.name, "path": str(run.path), "champion": champion, "writeback": wb,
            "status": "finished"}
