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
``evolve run --resume <name>`` continues the unfinished starts, then chooses. The
parent directory is opened, checked and written as every run directory is
(``evolve.runs.lifecycle``): its data's digests are recorded, and compared on resume.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from evolve.objectives import bind, placement
from evolve.runs import lifecycle, runner
from evolve.runs.finalise import finalise
from evolve.runs.lifecycle import load_splits
from evolve.runs.rundir import RunDir, now_iso
from evolve.search.config import Config
from evolve.tasks import task_of

STARTS_DIR = "starts"


def execute_any(opts, term) -> tuple[int, dict]:
    """Open the run ``opts`` asks for (``lifecycle.begin``), then run it: several
    starts here, a single one by ``runner.execute``."""
    with lifecycle.begin(opts) as begun:
        if begun.config.starts > 1:
            return execute(opts, term, begun)
        return runner.execute(opts, term, begun)


def execute(opts, term, begun: lifecycle.Begun | None = None) -> tuple[int, dict]:
    """A run of several starts: its parent directory opened, its data checked (their
    digests recorded, and on resume compared) and written by the lifecycle every run
    goes through; then the starts, each a run of its own."""
    if begun is None:
        with lifecycle.begin(opts) as begun:
            return execute(opts, term, begun)
    # the data checked in this process, the device the starts will use, the parent written
    begun.complete(prepare=lambda cfg, splits: placement.check(cfg.device))
    return _starts(opts, term, begun.run, begun.config, begun.data_dir)


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
    best = best_start(records)
    values = [r["test"][task.figure] for r in records]
    champion = {**best["champion"], "starts": [{k: v for k, v in r.items() if k != "champion"}
                                               for r in records],
                "chosen_seed": best["seed"],
                "over_starts": {"figure": f"test {task.figure}",
                                "median": statistics.median(values),
                                "min": min(values), "max": max(values), "n": len(values)}}
    wb = finalise(run, cfg, opts, champion, best["seed"],
                  lambda: load_splits(cfg, data_dir)["valid"],
                  {"starts": cfg.starts, "chosen_seed": best["seed"]},
                  meta_extra={"starts": cfg.starts})
    return {"run": run.name, "path": str(run.path), "champion": champion, "writeback": wb,
            "status": "finished"}


def best_start(records: list) -> dict:
    """The start whose champion is kept: the fewest target calls per correct answer on
    valid free-running where the starts were judged so (``_freerun_cost``), then the
    best valid score, the smaller tree, the smaller seed."""
    return max(records, key=lambda r: (-_freerun_cost(r), r["valid_score"], -r["size"],
                                       -r["seed"]))


def _freerun_cost(record: dict) -> float:
    """A start's target calls per correct answer on valid, free-running, where its
    champion was chosen so (a task run: ``evolve.freerun.select``; every start decodes
    the same problems with the same uniforms); 0 for every other start (the recorded
    score decides)."""
    sel = record["champion"].get("selection") or {}
    if "valid" not in sel:
        return 0.0
    c = sel["valid"].get("calls_per_correct")
    return float("inf") if c is None else float(c)

