"""Where an exported rule comes from: a run's champion, or an installed rule.

Trees are read from ``champion.json`` or from a heuristics module's
``METADATA`` literal and parsed against the primitive table; nothing is
imported or run.
"""

from __future__ import annotations

from pathlib import Path

from evolve.lang import treeio
from evolve.runs.rundir import RunDir, RunError
from evolve.tasks import TASKS, champion_task
from evolve.io.paths import heuristics_dir
from evolve.tasks.writeback import module_metadata

INSTALLED = {t.installed: f"{t.module}.py" for t in TASKS.values() if t.module}
META_KEYS = ("run", "seed", "date", "objective", "tv_budget", "tree", "generation")


def from_run(parent: Path, run: str) -> tuple[list, dict, str]:
    """(nodes, metadata, title) of a run's champion."""
    rd = RunDir.open(parent, run)
    champ = rd.champion()
    try:
        nodes = treeio.parse(champ["tree"])
    except treeio.TreeError as e:
        raise RunError(f"{rd.file('champion.json')}: field 'tree': {e}") from None
    seed = (rd.meta().get("config") or {}).get("seed")
    meta = {"run": rd.name, "seed": seed, "objective": champ.get("objective"),
            "tree": champ["tree"], "generation": champ.get("generation")}
    if champ.get("tv_budget") is not None:
        meta["tv_budget"] = champ["tv_budget"]
    task = champion_task(champ)
    meta["metrics"] = {k: _header_metrics(task, m)
                       for k, m in (champ.get("metrics") or {}).items() if isinstance(m, dict)}
    return nodes, meta, f"Acceptance rule exported from run {rd.name}"


def from_installed(kind: str, directory: Path | None = None) -> tuple[list, dict, str]:
    """(nodes, metadata, title) of the installed rule: heuristics/evolved_trace.py
    (``trace``) or heuristics/evolved.py (``tokens``)."""
    path = heuristics_dir(directory) / INSTALLED[kind]
    meta = module_metadata(path)
    try:
        nodes = treeio.parse(meta.get("tree"))
    except treeio.TreeError:
        how = next(t.writes_back for t in TASKS.values() if t.installed == kind)
        raise RunError(f"--installed {kind}: {path} holds no champion ({how})") from None
    keep = {k: meta[k] for k in META_KEYS if k in meta}
    keep["metrics"] = meta.get("metrics") if isinstance(meta.get("metrics"), dict) else {}
    return nodes, keep, f"Acceptance rule exported from heuristics/{INSTALLED[kind]}"


def _header_metrics(task, m: dict) -> dict:
    """The task's header metrics of one split (those it has: a hand-edited record
    may lack some)."""
    try:
        return task.header_metrics(m)
    except KeyError:
        return {k: m[k] for k in task.metric_keys if k in m}
