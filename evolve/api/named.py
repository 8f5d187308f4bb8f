"""Rules named as the commands name them: a rule of the table (``NAME``,
``NAME:PARAM``), a run's champion (``run:RUN``), the installed trace rule, or a
``Rule`` object; each as the decoders take it, with what a report says of it.

A champion keeps the scope it was scored in (``evolve.data.traces.scope_of``: the
decoding, draft length, top-k and temperature of its traces; token splits have none),
and its ``info`` says so (``info["scope"]``; a rule of the table has none and goes
anywhere). ``in_scope`` is the one check every command and API function that evaluates
a champion on data makes: outside its scope a champion is refused in one line naming
both scopes, or, where the caller asks (``any_scope``), evaluated with a label that
says so on every row.
"""

from __future__ import annotations

from pathlib import Path

from evolve.api.acceptance_rule import Rule
from evolve.data import traces
from evolve.errors import EvolveError, shorten, show
from evolve.lang import codegen, treeio
from evolve.rules.adapters import RuleError, named_rule, tree_rule
from evolve.runs import rundir as runs
from evolve.tasks import champion_task
from evolve.tasks.writeback import TRACE_MODULE, installed_trace

NO_SCOPE = "none recorded"       # a trace champion written before champions kept theirs
OUTSIDE = " [outside its scope]"  # every row of a champion evaluated outside its scope


class RuleSpecError(EvolveError):
    """A rule named for a comparison that is not one: one line naming the parameter."""


class ScopeError(EvolveError):
    """A champion asked to be evaluated on data of another scope than the one it was
    scored in: one line naming both, and how to evaluate it anyway (``any_scope`` to a
    Python caller, ``--any-scope`` on the command line)."""

    def __init__(self, param: str, why: str):
        self.why = why
        super().__init__(f"{param}: {self._detail('any_scope=True')}", param,
                         self._detail("any_scope=True"))

    def _detail(self, how: str) -> str:
        return (f"{self.why}; its figures there would not be the ones it was scored for "
                f"(pass {how} to evaluate it anyway, every row marked)")

    def named(self, label: str) -> str:
        return f"{label}: {self._detail('--any-scope')}"


def in_scope(rule, info: dict, data_scope: dict, any_scope: bool = False,
             param: str = "rules") -> tuple:
    """(rule, info) of a rule to be evaluated on data of ``data_scope``
    (``traces.scope_of``): unchanged when the rule has no scope (a rule of the table, a
    tree) or was scored in this one; a champion scored elsewhere (``info["scope"]``:
    another scope, None for token splits, ``NO_SCOPE``) is a ScopeError naming
    ``param``, or with ``any_scope`` the rule again with its label marked ``OUTSIDE``
    and ``info["outside_scope"]`` saying why."""
    if "scope" not in info:
        return rule, info
    claim = info["scope"]
    why = (f"{info['label']}: its champion records no scope (the traces it was scored on "
           "are unknown; re-run it)" if claim == NO_SCOPE else
           None if (m := traces.scope_mismatch(claim, data_scope)) is None else
           f"{info['label']}: {m}")
    if why is None:
        return rule, info
    if not any_scope:
        raise ScopeError(param, why)
    label = info["label"] + OUTSIDE
    info = {**info, "label": label, "outside_scope": why}
    if hasattr(rule, "name"):
        rule.name = label
    return rule, info


def _scope_claim(champion: dict):
    """The scope a champion record was scored in: its ``scope``, None for a champion of
    token splits, ``NO_SCOPE`` for a trace champion that records none."""
    if not champion_task(champion).trace_inputs:
        return None
    return champion.get("scope", NO_SCOPE)


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
            "objective": champ.get("objective"), "tv_budget": champ.get("tv_budget"),
            "scope": _scope_claim(champ)}
    return tree_rule(nodes, name), info


def rule_of(spec, runs_parent: Path, param: str = "rules", greedy: bool = False) -> tuple:
    """(rule, info) of a rule for a comparison: a ``Rule``, or text: NAME, NAME:PARAM or
    run:RUN; anything else is a one-line RuleSpecError naming ``param``. ``greedy``: a
    rule of the table as greedy task decoding takes it (``Rule.task_tree``)."""
    if isinstance(spec, Rule):
        info = {"kind": "rule", "name": spec.name, "label": spec.name, "param": None,
                "tree": spec.tree, "expression": spec.expression}
        if spec.scope is not None or spec.scored_on_tokens:
            info["scope"] = spec.scope      # a champion's rule keeps its scope
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
            "objective": meta.get("objective"), "tv_budget": meta.get("tv_budget"),
            "scope": meta.get("scope", NO_SCOPE)}
