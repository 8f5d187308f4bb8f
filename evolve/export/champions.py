"""Where an exported rule comes from: a run's champion, or an installed rule.

Trees are read from ``champion.json`` or from a heuristics module's
``METADATA`` literal and parsed against the primitive table; nothing is
imported or run.
"""

from __future__ import annotations

from pathlib import Path

from evolve.lang import treeio
from evolve.objectives import SETTING_KEYS, recorded_settings
from evolve.runs.rundir import RunDir, RunError
from evolve.runs.schema import SchemaError, check_scope
from evolve.tasks import TASKS, champion_task
from evolve.io.paths import heuristics_dir
from heuristics import registry
from evolve.tasks.writeback import module_metadata

INSTALLED = {t.installed: f"{t.module}.py" for t in TASKS.values() if t.module}
META_KEYS = ("run", "seed", "date", "objective", *SETTING_KEYS, "tree", "generation", "scope",
             "standing")


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
    meta.update({k: v for k, v in recorded_settings(champ).items() if v is not None})
    task = champion_task(champ)
    meta["metrics"] = {k: _header_metrics(task, m)
                       for k, m in (champ.get("metrics") or {}).items() if isinstance(m, dict)}
    for key in ("scope", "standing"):
        if key in champ:
            meta[key] = champ[key]
    _check_scope(task, meta, rd.file("champion.json"), "re-run it")
    return nodes, meta, f"Acceptance rule exported from run {rd.name}"


def _check_scope(task, meta: dict, where, how: str) -> None:
    """A trace champion carries the scope it was scored with (checked: it is written
    into code); one without it cannot be exported faithfully: a one-line RunError."""
    if not task.trace_inputs:
        meta["scope"] = None                  # token splits: no scope
        return
    if "scope" not in meta:
        raise RunError(f"{where}: the champion records no scope (the top-k, draft length and "
                       f"temperature of the traces it was scored on), so an export could not "
                       f"decide as it was scored; {how}")
    try:
        check_scope(meta["scope"], str(where))
    except SchemaError as e:
        raise RunError(str(e)) from None


def from_installed(kind: str, directory: Path | None = None) -> tuple[list, dict, str]:
    """(nodes, metadata, title) of the installed rule: heuristics/evolved_trace.py
    (``trace``) or heuristics/evolved.py (``tokens``)."""
    path = heuristics_dir(directory) / INSTALLED[kind]
    if kind == "tokens":      # the package's own until a run writes one back here
        path = registry.evolved_path(heuristics_dir(directory))
    meta = module_metadata(path)
    try:
        nodes = treeio.parse(meta.get("tree"))
    except treeio.TreeError:
        how = next(t.writes_back for t in TASKS.values() if t.installed == kind)
        raise RunError(f"--installed {kind}: {path} holds no champion ({how})") from None
    keep = {k: meta[k] for k in META_KEYS if k in meta}
    keep["metrics"] = meta.get("metrics") if isinstance(meta.get("metrics"), dict) else {}
    task = next(t for t in TASKS.values() if t.installed == kind)
    _check_scope(task, keep, path, "write a champion back again with `evolve run`")
    return nodes, keep, f"Acceptance rule exported from heuristics/{INSTALLED[kind]}"


def _header_metrics(task, m: dict) -> dict:
    """The task's header metrics of one split (those it has: a hand-edited record
    may lack some)."""
    try:
        return task.header_metrics(m)
    except KeyError:
        return {k: m[k] for k in task.metric_keys if k in m}
