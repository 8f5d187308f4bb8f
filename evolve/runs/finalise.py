"""The one way a run ends: champion.json, champion.py, the write-back and summary.json.

A single run (``evolve.runs.runner``) and a run of several starts
(``evolve.runs.multistart``) both end here, with the champion's record (what
champion.json holds) in hand; its task (``evolve.tasks``) gives the header
metrics, the heuristics module and the write-back, so the two cannot drift.
The champion is written from its parsed tree only: nothing under the run
directory is imported or run.
"""

from __future__ import annotations

from evolve.lang import codegen, treeio
from evolve.objectives import recorded_settings
from evolve.runs.rundir import RunDir, now_iso
from evolve.tasks import task_of


def champion_record(tree: str, nodes, generation, objective: str, metrics: dict,
                    settings: dict, **extra) -> dict:
    """champion.json's content (``settings``: what the objective records of the run's
    configuration, ``evolve.objectives.settings.champion_settings``)."""
    return {"expression": codegen.infix(nodes), "tree": tree, "size": len(nodes),
            "depth": treeio.depth(nodes), "generation": generation, "objective": objective,
            **settings, "metrics": metrics, **extra}


def module_metadata(run_name: str, seed: int, champion: dict, **extra) -> dict:
    """The METADATA (and header) of the champion's generated module."""
    task = task_of(champion["objective"])
    return {"run": run_name, "seed": seed, "objective": champion["objective"],
            "date": now_iso(), "tree": champion["tree"],
            "generation": champion.get("generation"),
            **recorded_settings(champion),
            **{k: champion[k] for k in ("scope", "standing") if k in champion},
            **extra,
            "metrics": {k: task.header_metrics(champion["metrics"][k])
                        for k in ("train", "valid", "test") if k in champion["metrics"]}}


def finalise(run: RunDir, config, opts, champion: dict, seed: int, valid, summary: dict,
             evaluator=None, meta_extra: dict | None = None) -> dict | None:
    """Write champion.json, champion.py, the write-back (``opts.writeback``) and
    summary.json (``summary``: the fields after its status); returns the write-back's
    decision. ``valid``: a callable giving the valid split (loaded only to write
    back); ``evaluator``: the run's valid evaluator, when it has one."""
    task = task_of(champion["objective"])
    nodes = treeio.parse(champion["tree"])
    meta = module_metadata(run.name, seed, champion, **(meta_extra or {}))
    source = codegen.module_source(nodes, "evolved", meta,
                                   f"Evolved acceptance rule (run {run.name})",
                                   trace=task.trace_inputs)
    run.write_text("champion.py", source)
    run.write_json("champion.json", champion)
    wb = None
    if opts.writeback:
        wb = task.install(nodes, source, meta, champion["metrics"]["valid"], valid(),
                          evaluator, config, run.name, opts)
    run.write_json("summary.json", {"status": "finished", **summary, "ended": now_iso(),
                                    "writeback": wb})
    return wb
