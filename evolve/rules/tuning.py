"""Rules on the (tokens per target call, distortion) axes: sweeps, tuning, trade-off.

Every rule family of the rules table (``evolve.rules.table``, ``family=True``)
is a tree with a parameter, scored with the exact objectives of
``evolve.objectives.spec``: ``sweep`` over its parameter grid (all grid points
in one call of the kernel runs use, ``evolve.kernels.speculative``); ``tune``
picks, on one split, the parameter with the most tokens per call whose mean TV
per token is within a budget (grid, then bisection, on kernel sums); a tuned
parameter is reported (``tuned_report``) by the numpy reference
(``evaluate``: ``evolve.lang.numpy_eval`` and ``spec.objectives``, which also
gives the 99th percentile of slot TV). ``pareto_front`` keeps the non-dominated
points; ``tradeoff`` is the report behind ``evolve tradeoff``. The kernel sums (the
sweeps, tuning, the fixed rules and the headroom tuning) run on ``device``: the Numba
kernel on "cpu", the torch kernel on "cuda" (``evolve.rules.kernel``, the same sums bit
for bit); the numpy reference always runs here.

Families that are an engine's own knob (``Rule.engine``) carry, in each tuned
trade-off row, the engine's flags or keyword arguments for the tuned value
(``setting``). A family with a target-only residual (SGLang) is scored by the
numpy reference and only where that is exact (``scorable``); elsewhere its row
says why (``not_exact``) and carries no numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from numbers import Real

import numpy as np

from evolve.errors import EvolveError, show

from evolve.lang import numpy_eval, treeio
from evolve.lang import primitives as P
from evolve.objectives import spec
from evolve.rules.table import RULES, families
from evolve.objectives import placement
from evolve.rules import headroom, kernel, value_gate
from evolve.objectives import trajectory


def thresholds(name: str, sa: spec.TraceArrays, param=None) -> np.ndarray:
    """Thresholds of a rule of the table on every candidate row of a trace split."""
    nodes = treeio.parse(RULES[name].tree(param))
    F = sa.features()
    return np.ascontiguousarray(numpy_eval.evaluate(nodes, F).reshape(-1), dtype=np.float64)


@dataclass(frozen=True)
class Point:
    rule: str
    param: float | None
    objectives: spec.Objectives

    @property
    def tokens(self) -> float:
        return self.objectives.tokens_per_call

    @property
    def tv(self) -> float:
        return self.objectives.tv_per_token

    @property
    def kl(self) -> float:
        return self.objectives.kl_per_token

    def label(self) -> str:
        if self.param is None:
            return self.rule
        return RULES[self.rule].label(self.param) if self.rule in RULES else self.rule

    def to_dict(self) -> dict:
        return {"rule": self.rule, "param": self.param, **self.objectives.to_dict()}


def _value(name: str, param):
    """A family's parameter as evaluated: None without one, its default for None."""
    r = RULES[name]
    return None if r.param is None else float(r.default if param is None else param)


def scoring(name: str, value) -> dict:
    """The keyword arguments of ``spec.objectives`` for a family at ``value``: its
    residual, and the ensemble weight of its tail drafts (``Rule.tail``)."""
    r = RULES[name]
    return {"residual": r.residual,
            "tail_weight": float(value) if r.tail == "ensemble" else 1.0}


def evaluate(name: str, sa: spec.TraceArrays, param=None) -> Point:
    value = _value(name, param)
    return Point(name, value, spec.objectives(sa, thresholds(name, sa, value),
                                              **scoring(name, value)))


def scored(name: str, sa: spec.TraceArrays, params, device: str = "cpu",
           tick=None) -> list[Point]:
    """Points of a family at several parameters, from one kernel call (sums only: no
    99th percentile of slot TV; ``evaluate`` is the reference). An engine's family
    (``Rule.scope`` "vocabulary": its own tail rule, or a target-only residual) is
    scored by the numpy reference, the kernel knows only the top-k rule with the
    standard tail and residual; a target-only family on traces whose candidates
    miss some of the draft's mass raises ``spec.TailError``. ``tick()``, when given, is
    called after each point the reference scores (seconds each on large traces) and
    after the kernel's call."""
    tick = tick or (lambda: None)
    if RULES[name].residual != "standard" or RULES[name].scope != "top_k":
        out = []
        for p in params:
            out.append(evaluate(name, sa, p))
            tick()
        return out
    values = [_value(name, p) for p in params]
    progs = treeio.linearise([treeio.parse(RULES[name].tree(v)) for v in values])
    out = [Point(name, v, o) for v, o in zip(values, kernel.results(progs, sa, True, device))]
    tick()
    return out


def sweep(name: str, sa: spec.TraceArrays, grid=None, device: str = "cpu",
          tick=None) -> list[Point]:
    r = RULES[name]
    return scored(name, sa, [None] if r.param is None else list(r.grid if grid is None
                                                                 else grid), device, tick)


def sweep_all(sa: spec.TraceArrays, names=None, device: str = "cpu",
              step=None) -> list[Point]:
    """Every family's sweep (of ``names``, default all); a family the split cannot score
    exactly (target-only: ``spec.TailError``; slot features missing: ``scorable``) is
    left out. ``step(name)``, when given, is called before each family and returns its
    ``tick`` (see ``scored``)."""
    out = []
    for n in (names or families()):
        tick = step(n) if step else None
        if sa.missing and scorable(n, sa) == sa.missing:
            continue
        try:
            out.extend(sweep(n, sa, device=device, tick=tick))
        except spec.TailError:
            continue
    return out


def scorable(name: str, sa: spec.TraceArrays) -> str | None:
    """None if the family's objectives are exact on ``sa``, else the reason (a rule
    that reads slot features on a split without them: ``TraceArrays.missing``)."""
    if sa.missing and P.uses_slot_inputs(treeio.parse(RULES[name].tree())):
        return sa.missing
    if RULES[name].residual == "standard":
        return None
    try:
        spec.check_full_candidates(sa)
    except spec.TailError as e:
        return str(e)
    return None


BISECT_STEPS = 20


def tune(name: str, sa_tune: spec.TraceArrays, budget: float, grid=None,
         measure: str = "tv", device: str = "cpu", tick=None) -> Point | None:
    """The parameter with the most tokens per call whose TV per token is <= budget
    on ``sa_tune`` (ties: smaller TV, then the earlier grid value); None if none fits.

    The grid is searched first; for lenient rules (TV and tokens grow together
    with leniency along the grid) the best feasible grid value is then refined
    by bisection towards its infeasible neighbour, so the tuned rule spends the
    budget instead of stopping at a coarse grid step. ``measure="kl"`` holds the KL
    per token to the budget instead. ``tick``: see ``scored``."""
    dist = (lambda p: p.kl) if measure == "kl" else (lambda p: p.tv)
    r = RULES[name]
    pts = sweep(name, sa_tune, grid, device, tick)
    feasible = [p for p in pts if dist(p) <= budget]
    if not feasible:
        return None
    best = max(feasible, key=lambda p: (p.tokens, -dist(p)))
    if r.param is None or not r.lenient:
        return best
    i = pts.index(best)
    if i + 1 >= len(pts) or dist(pts[i + 1]) <= budget:
        return best
    lo, hi = best.param, pts[i + 1].param   # feasible .. infeasible
    for _ in range(BISECT_STEPS):
        mid = scored(name, sa_tune, [0.5 * (lo + hi)], device, tick)[0]
        if dist(mid) <= budget:
            lo = mid.param
            if (mid.tokens, -dist(mid)) > (best.tokens, -dist(best)):
                best = mid
        else:
            hi = mid.param
    return best


def tuned_report(name: str, sa_valid: spec.TraceArrays, sa_test: spec.TraceArrays,
                 budget: float, grid=None, measure: str = "tv",
                 device: str = "cpu", tick=None) -> dict | None:
    """Tune on valid to a TV (or KL) budget, then evaluate that parameter on test; None
    when no parameter fits, or when the family's objectives are not exact on these
    splits (a target-only family on traces with top-k < vocabulary, ``scorable``)."""
    if scorable(name, sa_valid) or scorable(name, sa_test):
        return None
    best = tune(name, sa_valid, budget, grid, measure, device, tick)
    if best is None:
        return None
    valid, test = (evaluate(name, sa, best.param) for sa in (sa_valid, sa_test))
    return {"rule": name, "param": best.param, "budget": budget,
            "valid": valid.objectives.to_dict(), "test": test.objectives.to_dict()}


def pareto_front(points, x=lambda p: p.tv, y=lambda p: p.tokens) -> list:
    """Points not dominated (lower-or-equal x and higher-or-equal y, one strictly), by x."""
    pts = sorted(points, key=lambda p: (x(p), -y(p)))
    front, best = [], -np.inf
    for p in pts:
        if y(p) > best:
            front.append(p)
            best = y(p)
    return front


def series_of(points) -> dict:
    out: dict = {}
    for p in points:
        out.setdefault(p.rule, []).append((p.tv, p.tokens))
    return out


# ---------------------------------------------------------------- trade-off

def tradeoff(sa_valid: spec.TraceArrays, sa_test: spec.TraceArrays, budgets,
             extra: dict | None = None, blocks_test=None, device: str = "cpu",
             scope: dict | None = None, names=None, headroom: bool = True,
             progress=None) -> dict:
    """The trade-off report behind ``evolve tradeoff``.

    Every family of the rules table (or of ``names``, a list of family names: an
    engine's knobs, say) is swept on valid and on test; for each TV budget every one
    is tuned on valid (``tuned_report``) and reported on test.
    ``extra`` maps a name to a fixed rule as parsed tree nodes (a run's
    champion, say), evaluated as it is on both splits by the kernel runs use. Per budget the rows are
    sorted by tokens per call on test (families no parameter of which fits the
    budget on valid last). Two headroom rows join them: leniency with one
    parameter per block position (tuned on valid; not with ``headroom=False``) and the
    knapsack oracle
    (computed on test; ``evolve.rules.headroom``); every row carries the share
    of the oracle's gain over standard rejection it captures on test. With
    per-position leniency, on traces with slot features, two learned rows join too:
    the value gates (``evolve.rules.value_gate``; ``GATES``), their models fit on valid
    and λ tuned there, each slot's spend capped at the tuned per-position leniency's
    99th percentile of slot TV on valid (so their tail is no heavier); the one that reads
    ``ahead`` carries ``estimate`` (so does an extra rule that reads a lookahead
    input).
    ``series`` holds the test points for the pictures: each family's grid in
    sweep order, then each extra rule. With ``blocks_test`` (the test split's
    ``trajectory.TraceBlocks``) every rule row also carries, under
    ``test["trajectory"]``, the trajectory-aware estimate of its free-running
    tokens per call (``evolve.objectives.trajectory``). ``device``: where the kernel
    sums run ("cpu" or "cuda"; the same report). ``scope`` (``evolve.data.traces.scope_of``
    of the traces) adds to each engine setting the draft length and temperature the
    rules were scored with. ``progress(done, total, what)``, when given, is called as
    each of the ``total`` steps starts (a family's sweep or tuning, the headroom rows)
    and again every few seconds inside one (each point the numpy reference scores), so
    that a caller can say what is being done. Arguments of the wrong type or range
    are a one-line ``EvolveError`` naming the parameter."""
    placement.check(device)
    budgets = check_tradeoff_args(sa_valid, sa_test, budgets, extra, blocks_test)
    names = check_names(names)
    gates = headroom and not (sa_valid.missing or sa_test.missing)
    steps = _Steps(progress, 2 * len(names) + bool(extra) + gates + len(budgets) * (
        len(names) + bool(headroom) + 1 + gates + (blocks_test is not None)))
    sweeps = {s: sweep_all(sa, names, device, lambda n, s=s: steps.next(f"sweeping {n} "
                                                                         f"on {s}"))
              for s, sa in (("valid", sa_valid), ("test", sa_test))}
    fixed = {}
    if extra:   # the kernel a run scores its champion with: a run's numbers, to the bit
        steps.next(f"scoring {', '.join(extra)}")
        progs = treeio.linearise(list(extra.values()))
        res = {s: kernel.results(progs, sa, True, device)
               for s, sa in (("valid", sa_valid), ("test", sa_test))}
        # the sums hold no quantile: the 99th percentile of slot TV from the kernel's
        # thresholds, as a run's champion metrics have it (TraceObjective.metrics)
        from evolve.kernels.tokens import matrix_thresholds    # lazy: start-up (Numba)
        p99 = {s: [spec.objectives(sa, h).tv_p99 for h in matrix_thresholds(progs, sa.X)]
               for s, sa in (("valid", sa_valid), ("test", sa_test))}
        for i, name in enumerate(extra):
            fixed[name] = {s: {**r[i].to_dict(), "tv_p99": p99[s][i]} for s, r in res.items()}
            if P.uses_lookahead_inputs(extra[name]):
                fixed[name]["estimate"] = True
    values = {}
    if gates:
        steps.next("fitting the value gates' models on valid")
        values = {name: value_gate.fit(sa_valid, look) for name, look in GATES.items()}
    per_budget = []
    for b in budgets:
        rows = []
        for name in names:
            r = RULES[name]
            eng = {"engine": r.engine, "setting": None}
            tick = steps.next(f"tuning {name} to TV {b:g} on valid")
            why = scorable(name, sa_valid) or scorable(name, sa_test)
            rep = None if why else tuned_report(name, sa_valid, sa_test, b, device=device,
                                                tick=tick)
            if rep is None:
                rows.append({"rule": name, "kind": "family", "param": None, "budget": b,
                             "fits_valid": False, "over_budget_test": None,
                             "valid": None, "test": None, **eng,
                             **({"not_exact": why} if why else {})})
            else:
                rows.append({**rep, "kind": "family", "fits_valid": True,
                             "over_budget_test": rep["test"]["tv_per_token"] > b,
                             **eng, "setting": r.engine_setting(rep["param"], scope)})
        for name, o in fixed.items():
            rows.append({"rule": name, "kind": "extra", "param": None, "budget": b,
                         "fits_valid": o["valid"]["tv_per_token"] <= b,
                         "over_budget_test": o["test"]["tv_per_token"] > b, **o})
        if headroom:
            steps.next(f"tuning per-position leniency to TV {b:g} on valid")
        steps.next(f"the knapsack oracle at TV {b:g} on test")
        rows.extend(headroom_rows(sa_valid, sa_test, b, device, headroom))
        if gates:
            steps.next(f"tuning the value gates to TV {b:g} on valid")
            position = next(r for r in rows if r["rule"] == "position_leniency")
            rows.extend(value_gate_rows(sa_valid, sa_test, b, values,
                                        position_p99(position, sa_valid), device))
        for r in rows:
            _add_tv_by_distance(r, sa_test, extra or {})
        if blocks_test is not None:
            tick = steps.next(f"trajectory estimates at TV {b:g} on test")
            for r in rows:
                _add_trajectory(r, sa_test, blocks_test, extra or {})
                tick()
        oracle = next(r for r in rows if r["kind"] == "oracle")["test"]["tokens_per_call"]
        std = evaluate("standard_rejection", sa_test).tokens
        for r in rows:
            r["oracle_share"] = (None if r["test"] is None or oracle <= std else
                                 (r["test"]["tokens_per_call"] - std) / (oracle - std))
        rows.sort(key=lambda r: (r["test"] is None,
                                 -(r["test"]["tokens_per_call"] if r["test"] else 0.0)))
        per_budget.append({"budget": b, "rows": rows})
    series = series_of(sweeps["test"])
    for name, o in fixed.items():
        series[name] = [(o["test"]["tv_per_token"], o["test"]["tokens_per_call"])]
    return {"block_size": sa_test.g, "top_k": sa_test.k,
            "blocks": {"valid": sa_valid.n_blocks, "test": sa_test.n_blocks},
            "budgets": per_budget,
            "extra": fixed,
            "sweeps": {s: [p.to_dict() for p in pts] for s, pts in sweeps.items()},
            "series": {k: [list(xy) for xy in v] for k, v in series.items()}}


class _Steps:
    """The steps of a trade-off, told to ``progress(done, total, what)``."""

    def __init__(self, progress, total: int):
        self.progress, self.total, self.done = progress, total, 0

    def next(self, what: str):
        """Start the next step; returns its ``tick``, which tells the same step again."""
        if self.progress is None:
            return None
        done, total = min(self.done, self.total), self.total
        self.done += 1
        self.progress(done, total, what)
        return lambda: self.progress(done, total, what)


def check_names(names) -> list:
    """The families a trade-off sweeps (``names``; None: every family), checked."""
    if names is None:
        return families()
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise EvolveError.of("names", f"{show(names)} is invalid; expected a list of rule "
                             "families")
    names = list(dict.fromkeys(names))
    bad = next((n for n in names if n not in families()), None)
    if bad is not None or not names:
        raise EvolveError.of("names", f"{show(bad if names else names)} is invalid; expected "
                             f"families of the rules table ({', '.join(families())})")
    return names


def check_tradeoff_args(sa_valid, sa_test, budgets, extra, blocks_test) -> list:
    """The budgets of ``tradeoff`` as floats, once every argument is checked: a
    one-line EvolveError naming the parameter otherwise."""
    for param, sa in (("sa_valid", sa_valid), ("sa_test", sa_test)):
        if not isinstance(sa, spec.TraceArrays):
            raise EvolveError.of(param, f"{show(sa)} is invalid; expected a trace split's "
                                 "TraceArrays (evolve.objectives.spec)")
    if isinstance(budgets, (str, bytes, dict)) or not isinstance(budgets, Iterable):
        raise EvolveError.of("budgets", f"{show(budgets)} is invalid; expected a list of "
                             "TV budgets (numbers >= 0)")
    out = []
    for b in budgets:
        try:
            value = float(b) if isinstance(b, Real) and not isinstance(b, bool) else math.nan
        except OverflowError:                     # an int beyond the floats
            value = math.nan
        if not 0 <= value < math.inf:
            raise EvolveError.of("budgets", f"{show(b)} is invalid; expected a TV per token, "
                                 "a finite number >= 0")
        out.append(value)
    if extra is not None and not isinstance(extra, dict):
        raise EvolveError.of("extra", f"{show(extra)} is invalid; expected a dict of rule "
                             "names to parsed trees")
    for name, nodes in (extra or {}).items():
        if not (isinstance(name, str) and isinstance(nodes, (list, tuple)) and nodes
                and all(isinstance(n, treeio.Node) for n in nodes)):
            raise EvolveError.of("extra", f"{show(name)}: {show(nodes)} is invalid; expected "
                                 "a name and its parsed tree (evolve.lang.treeio.parse)")
    if blocks_test is not None:
        if not isinstance(blocks_test, trajectory.TraceBlocks):
            raise EvolveError.of("blocks_test", f"{show(blocks_test)} is invalid; expected "
                                 "the test split's TraceBlocks (evolve.objectives.trajectory)")
        if len(blocks_test.n_std) != sa_test.n_blocks:
            raise EvolveError.of("blocks_test", f"holds {len(blocks_test.n_std)} blocks, the "
                                 f"test split {sa_test.n_blocks}")
    return out


def tree_thresholds(nodes, sa: spec.TraceArrays) -> np.ndarray:
    """Thresholds of parsed tree nodes on every candidate row of a trace split."""
    return np.ascontiguousarray(numpy_eval.evaluate(nodes, sa.features()).reshape(-1),
                                dtype=np.float64)


def headroom_rows(sa_valid: spec.TraceArrays, sa_test: spec.TraceArrays, budget: float,
                  device: str = "cpu", position_leniency: bool = True) -> list:
    """Per-position leniency tuned on valid (reported on test; unless
    ``position_leniency`` is false) and the knapsack oracle on test, as trade-off rows."""
    rows = [position_leniency_row(sa_valid, sa_test, budget, device)] \
        if position_leniency else []
    oracle = headroom.knapsack_oracle(sa_test, budget).to_dict()
    rows.append({"rule": "knapsack_oracle", "kind": "oracle", "param": None, "budget": budget,
                 "fits_valid": None, "over_budget_test": oracle["tv_per_token"] > budget,
                 "valid": None, "test": oracle})
    return rows


def position_leniency_row(sa_valid: spec.TraceArrays, sa_test: spec.TraceArrays,
                          budget: float, device: str = "cpu") -> dict:
    """Leniency with one parameter per block position, tuned on valid, as a row."""
    tuned = headroom.tune_position_leniency(sa_valid, budget, device)
    if tuned is None:
        return {"rule": "position_leniency", "kind": "headroom", "param": None,
                "budget": budget, "fits_valid": False, "over_budget_test": None,
                "valid": None, "test": None}
    ls, valid = tuned
    nodes = treeio.parse(headroom.position_leniency_tree(ls))
    test = spec.objectives(sa_test, tree_thresholds(nodes, sa_test)).to_dict()
    return {"rule": "position_leniency", "kind": "headroom", "param": list(ls),
            "budget": budget, "fits_valid": True,
            "over_budget_test": test["tv_per_token"] > budget,
            "valid": valid.to_dict(), "test": test}


# The value gates of a trade-off (``evolve.rules.value_gate``): name -> whether the
# value model reads the lookahead inputs (its offline numbers then an estimate).
GATES = {"value_gate": False, "value_gate_ahead": True}


def position_p99(row: dict, sa_valid: spec.TraceArrays) -> float | None:
    """The 99th percentile of slot TV on valid of a tuned per-position leniency row
    (None when it did not fit): the spend cap of the value gates at its budget."""
    if row["param"] is None:
        return None
    nodes = treeio.parse(headroom.position_leniency_tree(row["param"]))
    return spec.objectives(sa_valid, tree_thresholds(nodes, sa_valid)).tv_p99


def value_gate_rows(sa_valid: spec.TraceArrays, sa_test: spec.TraceArrays, budget: float,
                    values: dict, cap: float | None, device: str = "cpu") -> list:
    """The value gates (models ``values``, fit on valid: name -> tree text), λ tuned on
    valid to ``budget`` with the spend cap ``cap`` per slot, reported on test, as
    trade-off rows (``estimate``: the gate reads a lookahead input)."""
    rows = []
    for name, value in values.items():
        row = {"rule": name, "kind": "learned", "budget": budget, "tv_cap": cap,
               "estimate": GATES[name]}
        tuned = value_gate.tune(value, sa_valid, budget, cap, device)
        if tuned is None:
            rows.append({**row, "param": None, "tree": None, "fits_valid": False,
                         "over_budget_test": None, "valid": None, "test": None})
            continue
        lam, valid = tuned
        tree = value_gate.gate_tree(value, lam, cap)
        test = spec.objectives(sa_test, tree_thresholds(treeio.parse(tree), sa_test)).to_dict()
        rows.append({**row, "param": lam, "tree": tree, "fits_valid": True,
                     "over_budget_test": test["tv_per_token"] > budget,
                     "valid": valid.to_dict(), "test": test})
    return rows


def row_tree_text(r: dict) -> str:
    """The tree text of a trade-off row's tuned rule (a family, the per-position leniency
    or a value gate; not the oracle, not a fixed rule)."""
    if r["kind"] == "learned":
        return r["tree"]
    if r["kind"] == "family":
        return RULES[r["rule"]].tree(r["param"])
    if r["kind"] == "headroom":
        return headroom.position_leniency_tree(r["param"])
    raise EvolveError.of("row", f"a {r['kind']} row has no tuned rule")


def _row_tree(r: dict, extra: dict):
    """The parsed tree of a trade-off row's rule (None for the oracle, a bound)."""
    if r["kind"] == "learned":
        return treeio.parse(r["tree"])
    if r["kind"] == "family":
        return treeio.parse(RULES[r["rule"]].tree(r["param"]))
    if r["kind"] == "headroom":
        return treeio.parse(headroom.position_leniency_tree(r["param"]))
    if r["kind"] == "extra":
        return extra[r["rule"]]
    return None


def _top_k_tree(r: dict, extra: dict):
    """The parsed tree of a row's rule with test figures when it is a top-k rule with the
    standard tail and residual, which the numpy reference and the trajectory estimate
    model; None else."""
    if r["test"] is None or r["kind"] == "family" and (
            RULES[r["rule"]].residual != "standard" or RULES[r["rule"]].scope != "top_k"):
        return None
    return _row_tree(r, extra)


def _add_tv_by_distance(r: dict, sa_test: spec.TraceArrays, extra: dict) -> None:
    """A row's test TV by distance from the prompt (``spec.tv_by_distance``; None for a
    rule the numpy reference does not model)."""
    if r["test"] is not None:
        nodes = _top_k_tree(r, extra)
        r["test"] = {**r["test"], "tv_by_distance": None if nodes is None else
                     spec.tv_by_distance(sa_test, tree_thresholds(nodes, sa_test))}


def _add_trajectory(r: dict, sa_test: spec.TraceArrays, blocks_test, extra: dict) -> None:
    nodes = _top_k_tree(r, extra)
    if nodes is not None:
        est = trajectory.estimate(sa_test, blocks_test, tree_thresholds(nodes, sa_test))
        r["test"] = {**r["test"], "trajectory": est.to_dict()}
