"""``evolve.tradeoff``: every rule family tuned to TV budgets on valid, reported on test
(what ``evolve tradeoff`` prints).

    import evolve
    t = evolve.tradeoff("datasets/traces", budgets=[0.01, 0.03])
    t.best(0.01)                     # the rule with the most tokens per call at TV 0.01
    import pandas; pandas.DataFrame(t.rows)        # one flat record per rule and budget

The numerics are ``evolve.rules.tuning.tradeoff``'s; this adds what a user names:
the traces' directory, run champions (``runs``), the installed trace rule, an engine
whose knobs alone are swept (``engine``: its families and standard rejection), the
picture (``png``) and progress. Bad arguments are one-line errors naming the
parameter, before any work.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from numbers import Real
from pathlib import Path

from evolve.api.named import ScopeError, in_scope, installed_rule, run_rule
from evolve.api.progress import steps_meter
from evolve.data import traces
from evolve.errors import EvolveError, show
from evolve.export.outfile import check_target
from evolve.io import paths
from evolve.objectives import placement
from evolve.objectives import spec
from evolve.objectives.trajectory import TraceBlocks
from evolve.rules import tuning
from evolve.rules.table import ENGINES, engine_families, families
from evolve.runs import pictures

DEFAULT_BUDGETS = (0.01, 0.03)
FLAT = ("tokens_per_call", "tokens_se", "tv_per_token", "tv_p99", "kl_per_token")


class TradeoffError(EvolveError):
    """A trade-off asked with an argument of the wrong type or range (one line)."""


@dataclass(frozen=True)
class Tradeoff:
    """A trade-off: ``report`` is what ``evolve tradeoff --json`` prints (every row per
    budget, the sweeps, the fixed rules); ``series`` the test points drawn, by name, in
    drawing order; ``png`` the picture written (or None)."""
    report: dict
    series: dict
    png: Path | None = None

    @property
    def budgets(self) -> list:
        return [e["budget"] for e in self.report["budgets"]]

    @property
    def rows(self) -> list[dict]:
        """One flat record per rule and budget (``pandas.DataFrame(t.rows)``): budget,
        rule, kind, param, engine, setting, fits_valid, over_budget_test, oracle_share,
        why (no numbers), estimate (offline numbers of a rule that reads a lookahead
        input), then valid_* and test_* of tokens_per_call, tokens_se,
        tv_per_token, tv_p99 and kl_per_token (None where a row has none)."""
        out = []
        for entry in self.report["budgets"]:
            for r in entry["rows"]:
                rec = {"budget": entry["budget"], "rule": r["rule"], "kind": r["kind"],
                       "param": r.get("param"), "engine": r.get("engine"),
                       "setting": r.get("setting"), "fits_valid": r.get("fits_valid"),
                       "over_budget_test": r.get("over_budget_test"),
                       "oracle_share": r.get("oracle_share"), "why": why_empty(r),
                       "estimate": bool(r.get("estimate"))}
                for split in ("valid", "test"):
                    m = r.get(split) or {}
                    rec.update({f"{split}_{k}": m.get(k) for k in FLAT})
                out.append(rec)
        return out

    def best(self, budget: float) -> dict | None:
        """The record of the rule with the most tokens per call on test among those
        tuned within ``budget`` on valid and scored exactly (the oracle, a bound, is not
        a rule; a rule that reads a lookahead input has estimated numbers)."""
        fits = [r for r in self.rows if r["budget"] == budget and r["fits_valid"]
                and r["kind"] != "oracle" and not r["estimate"]
                and r["test_tokens_per_call"] is not None]
        return max(fits, key=lambda r: r["test_tokens_per_call"], default=None)


def why_empty(row: dict) -> str | None:
    """Why a trade-off row has no numbers (None when it has them)."""
    if row.get("test") is not None:
        return None
    if row.get("not_exact"):
        return "needs slot features" if "slot_" in row["not_exact"] else \
            "needs top-k = vocabulary"
    return "no parameter fits on valid"


def check_budgets(budgets) -> list:
    """TV budgets as floats (None: ``DEFAULT_BUDGETS``), each finite and >= 0; repeated
    ones once."""
    if budgets is None:
        return list(DEFAULT_BUDGETS)
    if isinstance(budgets, Real):
        budgets = [budgets]
    try:
        items = list(budgets)
    except TypeError:
        raise TradeoffError.of("budgets", f"{show(budgets)} is invalid; expected TV budgets "
                                          "(numbers >= 0)") from None
    out = []
    for b in items:
        ok = isinstance(b, Real) and not isinstance(b, bool)
        try:
            value = float(b) if ok else math.nan
        except OverflowError:
            value = math.nan
        if not 0 <= value < math.inf:
            raise TradeoffError.of("budgets", f"{show(b)} is invalid; expected a TV per token "
                                              ">= 0")
        out.append(value)
    if not out:
        raise TradeoffError.of("budgets", "empty; expected at least one TV budget")
    return list(dict.fromkeys(out))


def tradeoff(data_dir=None, budgets=None, runs=(), runs_dir=None, png=None,
             trajectory: bool = False, engine: str | None = None, device: str = "cpu",
             installed: bool = True, progress=None, meter=None,
             any_scope: bool = False) -> Tradeoff:
    """Every rule family tuned on valid to each TV budget and reported on test.

    ``data_dir``: the trace splits (default ``datasets/traces``); ``budgets``: TV per
    token (default 0.01 and 0.03); ``runs``: run champions to add (names under
    ``runs_dir``, paths, or RunResults); ``installed``: add the installed trace rule;
    ``png``: also draw the picture there; ``trajectory``: each rule's own-trajectory
    estimate too; ``engine`` (transformers or sglang): sweep only that engine's knobs
    and standard rejection; ``device``: where the kernel sums run (cpu or cuda, the same
    report). ``progress``: a callable given a line at most every 10 s of a long step
    (``print``); ``meter``: the command line's bar instead.

    A champion is tuned and reported only on traces of the scope it was scored in
    (``evolve.api.named.in_scope``): a run of another scope is a one-line ScopeError
    naming both, the installed rule of another scope is left out (``report
    ["left_out"]`` says why); ``any_scope`` keeps both, their rows marked."""
    budgets = check_budgets(budgets)
    if engine is not None and engine not in ENGINES:
        raise TradeoffError.of("engine", f"{show(engine)} is invalid; expected one of "
                                         f"{', '.join(ENGINES)}")
    for param, flag in (("trajectory", trajectory), ("installed", installed),
                        ("any_scope", any_scope)):
        if not isinstance(flag, bool):
            raise TradeoffError.of(param, f"{show(flag)} is invalid; expected True or False")
    if isinstance(runs, (str, bytes)) or not hasattr(runs, "__iter__"):
        runs = [runs]
    placement.check(device)           # before any work: one line naming the device
    if png is not None:
        png = check_target("png", png)
    data_dir = Path(data_dir) if data_dir is not None else paths.TRACES_DIR
    t0 = time.perf_counter()
    splits = traces.load_splits(data_dir, ("valid", "test"))
    scope = traces.scope_of(splits["valid"].meta)
    extra, infos, left_out = {}, [], []
    parent = paths.runs_dir(runs_dir)
    for r in {str(getattr(r, "path", r)): r for r in runs}.values():
        rule, info = in_scope(*run_rule(parent, r), scope, any_scope, "runs")
        extra[info["label"]] = rule.nodes
        infos.append(info)
    if installed:
        found = installed_rule()
        if found is not None:
            nodes = found.pop("nodes")
            try:
                _, found = in_scope(None, found, scope, any_scope, "installed")
            except ScopeError as e:       # not asked for by name: left out, and said so
                left_out.append(e.why)
            else:
                extra[found["label"]] = nodes
                infos.append(found)
    sas = {s: spec.TraceArrays.from_split(ts) for s, ts in splits.items()}
    names = families() if engine is None else \
        ["standard_rejection"] + engine_families(engine)
    say = progress or (lambda text: None)
    for why in left_out:
        say(f"the installed rule is left out: {why}")
    say(f"sweeping {len(names)} rule families on valid and test, tuning to "
        f"{len(budgets)} budget(s) ...")
    with steps_meter(meter, progress, "tradeoff", 1) as m:
        def step(done, total, what):
            m.set_total(total)
            m.advance(done - m.done, what)
        res = tuning.tradeoff(sas["valid"], sas["test"], budgets, extra,
                              TraceBlocks.from_split(splits["test"]) if trajectory else None,
                              device, scope, names=names,
                              headroom=engine is None, progress=step)
    # standard last among the families: drawn over leniency l=1 and ears beta=0 (same point)
    order = [k for k in res["series"] if k in families() and k != "standard_rejection"]
    order += [k for k in res["series"] if k not in order]
    series = {k: [tuple(xy) for xy in res["series"][k]] for k in order}
    if png is not None:
        tuned = [(r["rule"], r["test"]["tv_per_token"], r["test"]["tokens_per_call"],
                  r["test"].get("tokens_se")) for e in res["budgets"] for r in e["rows"]
                 if r["test"] is not None and r["kind"] != "extra"]
        try:
            pictures.render_png(series, png, f"{data_dir}: test split (g = "
                                f"{res['block_size']}, k = {res['top_k']})", budgets, tuned)
        except RuntimeError as e:       # matplotlib missing
            raise TradeoffError.of("png", str(e)) from None
        except OSError as e:            # the directory went away, a full disk, ...
            raise TradeoffError.of("png", f"{png}: {e.strerror or e}") from None
        say(f"{png}: written")
    report = {"data": str(data_dir), **res, "runs": infos, "left_out": left_out,
              "png": None if png is None else str(png), "trajectory": trajectory,
              "engine": engine, "seconds": round(time.perf_counter() - t0, 3)}
    return Tradeoff(report, series, png)
