"""Rules named as the commands name them: a rule of the table (``NAME``,
``NAME:PARAM``), a run's champion (``run:RUN``), the installed trace rule, or a
``Rule`` object; each as the decoders take it, with what a report says of it."""

from __future__ import annotations

from pathlib import Path

from evolve.api.acceptance_rule import Rule
from evolve.errors import EvolveError, shorten, show
from evolve.lang import codegen, treeio
from evolve.rules.adapters import RuleError, named_rule, tree_rule
from evolve.runs import rundir as runs
from evolve.tasks.writeback import TRACE_MODULE, installed_trace


class RuleSpecError(EvolveError):
    """A rule named for a comparison that is not one: one line naming the parameter."""


def run_rule(runs_parent: Path, run) -> tuple:
    """(rule, info) of a run's champion: its tree parsed (never evaluated). ``run``: a
    run name under ``runs_parent``, a run directory's path, or a RunResult."""
    rd = runs.RunDir.open(runs_parent, str(getattr(run, "path", run)))
    champ = rd.champion(metrics_needed=False)     # the rule is its tree
    try:
        nodes = treeio.parse(champ["tree"])
    except treeio.TreeError as e:
        raise runs.RunError(f"{rd.file('champion.json')}: field 'tree': {e}") from None
    name = f"run {rd.name}"
    info = {"kind": "run", "name": rd.name, "label": name, "param": None,
            "tree": champ["tree"], "expression": codegen.infix(nodes),
            "objective": champ.get("objective"), "tv_budget": champ.get("tv_budget")}
    return tree_rule(nodes, name), info


def rule_of(spec, runs_parent: Path, param: str = "rules", greedy: bool = False) -> tuple:
    """(rule, info) of a rule for a comparison: a ``Rule``, or text: NAME, NAME:PARAM or
    run:RUN; anything else is a one-line RuleSpecError naming ``param``. ``greedy``: a
    rule of the table as greedy task decoding takes it (``Rule.task_tree``)."""
    if isinstance(spec, Rule):
        info = {"kind": "rule", "name": spec.name, "label": spec.name, "param": None,
                "tree": spec.tree, "expression": spec.expression}
        return tree_rule(spec.nodes, spec.name), info
    if not isinstance(spec, str):
        raise RuleSpecError.of(param, f"{show(spec)} is invalid; expected NAME, NAME:PARAM, "
                                      "run:RUN or a Rule")
    shown = show(spec)                 # echoed shortened: the line stays a line
    if spec.startswith("run:"):
        if not spec[4:].strip():
            raise RuleSpecError.of(param, f"{shown}: the run name after 'run:' is empty")
        try:
            return run_rule(runs_parent, spec[4:])
        except EvolveError as e:
            raise RuleSpecError.of(param, f"{shown}: {shorten(str(e), 300)}") from None
        except OSError as e:          # a name the system refuses (too long, ...)
            raise RuleSpecError.of(param, f"{shown}: "
                                          f"{e.strerror or shorten(str(e), 300)}") from None
    name, colon, value = spec.partition(":")
    if colon and not value.strip():
        raise RuleSpecError.of(param, f"{shown}: the parameter after ':' is empty; give NAME "
                                      "or NAME:PARAM")
    try:
        number = float(value) if colon else None
    except ValueError:
        raise RuleSpecError.of(param, f"{shown}: the parameter {show(value)} is not a "
                                      "number") from None
    try:
        return named_rule(name, number, greedy)
    except RuleError as e:
        raise RuleSpecError.of(param, f"{shown}: {shorten(str(e), 300)}") from None


def installed_rule():
    """The installed trace rule (heuristics/evolved_trace.py) as an info dict with its
    parsed nodes, or None when there is none."""
    found = installed_trace()
    if found is None:
        return None
    nodes, meta = found
    return {"kind": "installed", "name": TRACE_MODULE, "nodes": nodes,
            "label": f"installed * (run {meta.get('run', '?')})", "param": None,
            "tree": meta.get("tree"), "expression": codegen.infix(nodes),
            "objective": meta.get("objective"), "tv_budget": meta.get("tv_budget")}
