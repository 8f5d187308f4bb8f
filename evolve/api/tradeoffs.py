"""``evolve.tradeoff``: every rule family tuned to TV budgets on valid, reported on test
(what ``evolve tradeoff`` prints); on task traces (``evolve data task``) every rule tuned
to accuracy budgets by free-running decoding, judged by target calls per correct answer.

    import evolve
    t = evolve.tradeoff("datasets/traces", budgets=[0.01, 0.03])
    best = t.best(0.01)              # the rule with the most tokens per call at TV 0.01
    best["export"]                   # how to deploy it (or why it cannot be)
    evolve.export(t.rule(0.01, best["rule"]), format="hf")     # when it is a rule to export
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
from evolve.data import shards, traces
from evolve.errors import EvolveError, show
from evolve.export.outfile import check_target
from evolve.io import paths
from evolve.lang import treeio
from evolve.objectives import placement
from evolve.objectives import spec
from evolve.objectives.trajectory import TraceBlocks
from evolve.rules import tuning
from evolve.rules.table import ENGINES, engine_families
from evolve.rules.table import families as table_families
from evolve.runs import pictures

DEFAULT_BUDGETS = (0.01, 0.03)
FLAT = ("tokens_per_call", "tokens_se", "tv_per_token", "tv_p99", "kl_per_token")
TASK_FLAT = ("calls_per_problem", "calls_per_correct", "accuracy", "agreement",
             "answer_tokens", "tokens_per_call", "time_per_correct", "speedup")


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
        input), tree (the rule's tree text; None for the oracle), exportable and export
        (how to deploy the row: its engine setting, ``evolve export RUN``, or
        ``evolve.export(t.rule(budget, rule), format=...)`` with the formats that can
        compute its inputs; else why it cannot be, ``deploy``), then valid_* and test_*
        of tokens_per_call, tokens_se, tv_per_token, tv_p99 and kl_per_token (None where
        a row has none)."""
        out = []
        for entry in self.report["budgets"]:
            for r in entry["rows"]:
                rec = {"budget": entry["budget"], "rule": r["rule"], "kind": r["kind"],
                       "param": r.get("param"), "engine": r.get("engine"),
                       "setting": r.get("setting"), "fits_valid": r.get("fits_valid"),
                       "over_budget_test": r.get("over_budget_test"),
                       "oracle_share": r.get("oracle_share"), "why": why_empty(r),
                       "estimate": bool(r.get("estimate")), "tree": r.get("tree"),
                       "exportable": r.get("exportable"), "export": r.get("export")}
                for split in ("valid", "test"):
                    m = r.get(split) or {}
                    rec.update({f"{split}_{k}": m.get(k) for k in FLAT})
                out.append(rec)
        return out

    def rule(self, budget: float, name: str):
        """The rule of row ``name`` at ``budget`` as an ``evolve.Rule`` (its tree, the
        scope of the traces it was tuned on, its test metrics), for ``evolve.export``;
        a RuleError line when the row has no rule (the oracle, a family no parameter of
        which fits)."""
        from evolve.api.acceptance_rule import Rule, RuleInputError    # lazy: as used
        row = next((r for r in self.rows if r["budget"] == budget and r["rule"] == name),
                   None)
        if row is None:
            raise RuleInputError.of("name", f"{show(name)} at budget {show(budget)}: no such "
                                            f"row (budgets: {', '.join(map(str, self.budgets))})")
        if row["tree"] is None or not row["exportable"] or row.get("setting"):
            raise RuleInputError.of("name", f"{name} at budget {budget:g}: no rule to "
                                            f"export ({row['export']})")
        metrics = {s: {k: row[f"{s}_{k}"] for k in FLAT if row[f"{s}_{k}"] is not None}
                   for s in ("valid", "test")}
        scope = self.report.get("scope")
        return Rule(row["tree"], scope=scope, metrics=metrics,
                    name=name if row["kind"] == "extra" else f"{name} (tuned to TV {budget:g})")

    def best(self, budget: float) -> dict | None:
        """The record of the rule with the most tokens per call on test among those
        tuned within ``budget`` on valid and scored exactly (the oracle, a bound, is not
        a rule; a rule that reads a lookahead input has estimated numbers)."""
        fits = [r for r in self.rows if r["budget"] == budget and r["fits_valid"]
                and r["kind"] != "oracle" and not r["estimate"]
                and r["test_tokens_per_call"] is not None]
        return max(fits, key=lambda r: r["test_tokens_per_call"], default=None)


@dataclass(frozen=True)
class TaskTradeoff:
    """A trade-off on a task: ``report`` is what ``evolve tradeoff --json`` prints on task
    traces (``evolve.freerun.task_compare.tradeoff``'s report, with the data's name and sizes)."""
    report: dict
    png: Path | None = None

    @property
    def budgets(self) -> list:
        return [e["budget"] for e in self.report["budgets"]]

    @property
    def rows(self) -> list[dict]:
        """One flat record per rule and budget (``pandas.DataFrame(t.rows)``): budget,
        rule, kind (family, judge, run or oracle), param, fits_valid, oracle_share (with
        the oracle), then valid_* and test_* of calls_per_problem (target calls per
        answer), calls_per_correct, accuracy, agreement, answer_tokens,
        tokens_per_call, and with a draft cost time_per_correct and speedup (None where
        a row has none)."""
        out = []
        for entry in self.report["budgets"]:
            for r in entry["rows"]:
                rec = {"budget": entry["budget"], "rule": r["rule"], "kind": r["kind"],
                       "param": r["param"], "fits_valid": r["fits_valid"],
                       "oracle_share": r.get("oracle_share")}
                for split in ("valid", "test"):
                    m = r.get(split) or {}
                    rec.update({f"{split}_{k}": m.get(k) for k in TASK_FLAT})
                out.append(rec)
        return out

    def best(self, budget: float) -> dict | None:
        """The record of the rule with the fewest target calls per correct answer on test
        among those tuned within ``budget`` on valid."""
        fits = [r for r in self.rows if r["budget"] == budget and r["fits_valid"]]
        return min(fits, key=lambda r: r["test_calls_per_correct"], default=None)


def row_tree(row: dict, runs: list) -> str | None:
    """The tree text of a trade-off row's rule: a run's champion (``runs``: the infos of
    the fixed rules), a tuned rule; None for the oracle (a bound) and a row without
    numbers."""
    if row["kind"] == "extra":
        info = next((i for i in runs if i.get("label") == row["rule"]), {})
        return info.get("tree")
    if row["kind"] == "oracle" or row.get("test") is None:
        return None
    return tuning.row_tree_text(row)


def deploy(row: dict, tree: str | None, budget: float, run: dict | None) -> tuple[bool, str]:
    """(exportable, how): how a trade-off row's rule is deployed, or why it cannot be:
    an engine's own setting (no patch), ``evolve export`` of a run or of the installed
    rule, or ``evolve.export(t.rule(budget, name))`` in the formats that compute its
    inputs; the oracle is a bound and a row without numbers has no rule."""
    # lazy: the export layer loads only when a trade-off is reported
    from evolve.export.modules import FORMATS, PATCHES, ExportError, check_format
    from evolve.rules.table import RULES    # lazy: as above
    if row["kind"] == "oracle":
        return False, "a bound computed on test, not a rule"
    if row.get("test") is None:
        return False, why_empty(row)
    if row["kind"] == "family" and row.get("setting"):
        return True, f"{row['engine']} setting, no patch: {row['setting']}"
    if row["kind"] == "family" and (RULES[row["rule"]].residual != "standard"
                                    or RULES[row["rule"]].scope != "top_k"):
        return False, "scored with its engine's own tail or residual, which no export writes"
    if row["kind"] == "extra":
        if run is None or run.get("kind") != "run":
            return True, "evolve export --installed"
        return True, f"evolve export {run['name']}"
    nodes = treeio.parse(tree)
    formats = []
    for f in FORMATS + PATCHES:
        try:
            check_format(f, nodes)
        except ExportError:
            continue
        formats.append(f)
    note = "; its numbers are an estimate (it reads a lookahead input)" \
        if row.get("estimate") else ""
    return True, (f"evolve.export(t.rule({budget:g}, {row['rule']!r}), format=...): "
                  f"{', '.join(formats)}{note}")


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
             any_scope: bool = False, prompts: int | None = None,
             agreement_budget: float | None = None, oracle: bool | int = False,
             families=None, draft_cost: float | str | None = "measure"):
    """Every rule family tuned on valid to each TV budget and reported on test.

    ``data_dir``: the trace splits, .npz files or shards (``evolve data shard``, read
    whole; default ``datasets/traces``); ``budgets``: TV per token (default 0.01 and
    0.03); ``runs``: run champions to add (names under
    ``runs_dir``, paths, or RunResults); ``installed``: add the installed trace rule;
    ``png``: also draw the picture there; ``trajectory``: each rule's own-trajectory
    estimate too; ``engine`` (transformers or sglang): sweep only that engine's knobs
    and standard rejection; ``device``: where the kernel sums run (cpu or cuda, the same
    report). ``progress``: a callable given a line at most every 10 s of a long step
    (``print``); ``meter``: the command line's bar instead. ``families``: tune only
    these rule families (names of the rules table; standard rejection, the reference,
    is always swept on traces; on task traces ``learned_judge`` names the learned
    judge, which is tuned only when named), with ``engine`` those of them that are
    its knobs.

    A champion is tuned and reported only on traces of the scope it was scored in
    (``evolve.api.named.in_scope``): a run of another scope is a one-line ScopeError
    naming both, the installed rule of another scope is left out (``report
    ["left_out"]`` says why); ``any_scope`` keeps both, their rows marked.

    On task traces (``evolve data task``; a ``TaskTradeoff``) ``budgets`` are accuracy
    drops from lossless decoding, every rule family, the learned judge and the
    ``runs``' champions are tuned on valid by free-running decoding to the fewest
    target calls per correct answer within each (``evolve.freerun.task_compare.tradeoff``),
    and reported on test, paired; ``prompts`` caps the problems of valid and test,
    ``agreement_budget`` also bounds the share of answers changed from lossless, and
    ``oracle`` adds the answer oracle's row (the headroom any judge has, decoded on test;
    a whole number: on that many test problems, every share measured on them) and each
    rule's share of its saving. ``draft_cost`` (the draft's cost per token relative to
    a target call, >= 0) adds the time per correct answer under that cost model and the
    speed-up over the target decoding alone (``task_compare.with_time``); "measure" (the
    default) times one decoding step of each model where the pair has models to time (a
    Hugging Face pair: ``report["time_model"]["measured"]`` says how; the built-in pair
    has none, and gets no time model), None never adds it."""
    budgets = check_budgets(budgets)
    data_dir = Path(data_dir) if data_dir is not None else paths.TRACES_DIR
    if is_task(data_dir):
        bad = next((p for p, v, plain in (("trajectory", trajectory, False),
                                          ("device", device, "cpu"), ("png", png, None))
                    if v != plain), None)
        if bad is not None:
            raise TradeoffError.of(bad, "not on task traces (their rules are compared by "
                                        "free-running decoding, on the CPU)")
        return task_tradeoff(data_dir, budgets, runs, runs_dir, engine, prompts,
                             agreement_budget, any_scope, progress, oracle, families,
                             draft_cost)
    task_only = next((p for p, v in (("prompts", prompts), ("agreement_budget",
                      agreement_budget), ("oracle", oracle or None),
                      ("draft_cost", None if draft_cost == "measure" else draft_cost))
                      if v is not None), None)
    if task_only is not None:
        raise TradeoffError.of(task_only, "only on task traces (evolve data task)"
                               + ("; on traces every table has its knapsack oracle"
                                  if task_only == "oracle" else ""))
    if engine is not None and engine not in ENGINES:
        raise TradeoffError.of("engine", f"{show(engine)} is invalid; expected one of "
                                         f"{', '.join(ENGINES)}")
    for param, flag in (("trajectory", trajectory), ("installed", installed),
                        ("any_scope", any_scope)):
        if not isinstance(flag, bool):
            raise TradeoffError.of(param, f"{show(flag)} is invalid; expected True or False")
    if isinstance(runs, (str, bytes)) or not hasattr(runs, "__iter__"):
        runs = [runs]
    chosen = chosen_families(families, table_families())
    placement.check(device)           # before any work: one line naming the device
    if png is not None:
        png = check_target("png", png)
    t0 = time.perf_counter()
    splits = shards.load_in_memory(data_dir, ("valid", "test"))     # .npz or shards
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
    names = table_families() if engine is None else \
        ["standard_rejection"] + engine_families(engine)
    if chosen is not None:
        names = ["standard_rejection"] + [n for n in names if n in chosen
                                          and n != "standard_rejection"]
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
    order = [k for k in res["series"] if k in table_families() and k != "standard_rejection"]
    order += [k for k in res["series"] if k not in order]
    series = {k: [tuple(xy) for xy in res["series"][k]] for k in order}
    if png is not None:
        tuned = [(r["rule"], r["test"]["tv_per_token"], r["test"]["tokens_per_call"],
                  r["test"].get("tokens_se"), e["budget"]) for e in res["budgets"]
                 for r in e["rows"] if r["test"] is not None]
        name = data_dir.name or data_dir.resolve().name       # the data, by its directory
        try:
            pictures.render_png(series, png, f"{name}: test split (g = "
                                f"{res['block_size']}, k = {res['top_k']})", budgets, tuned)
        except RuntimeError as e:       # matplotlib missing
            raise TradeoffError.of("png", str(e)) from None
        except OSError as e:            # the directory went away, a full disk, ...
            raise TradeoffError.of("png", f"{png}: {e.strerror or e}") from None
        say(f"{png}: written")
    for entry in res["budgets"]:          # each row: its rule and how it is deployed
        for r in entry["rows"]:
            r["tree"] = row_tree(r, infos)
            run = next((i for i in infos if i.get("label") == r["rule"]), None)
            r["exportable"], r["export"] = deploy(r, r["tree"], entry["budget"], run)
    report = {"data": str(data_dir), **res, "runs": infos, "left_out": left_out,
              "scope": scope,
              "png": None if png is None else str(png), "trajectory": trajectory,
              "engine": engine, "seconds": round(time.perf_counter() - t0, 3)}
    return Tradeoff(report, series, png)


JUDGE_FAMILY = "learned_judge"      # the learned judge, as --family names it (task traces)


def chosen_families(chosen, known: list, where: str = "of traces") -> list | None:
    """``chosen`` (names of rule families, or None: every one) checked against
    ``known``: a TradeoffError naming the first unknown one and what is known."""
    if chosen is None:
        return None
    if isinstance(chosen, (str, bytes)) or not hasattr(chosen, "__iter__"):
        chosen = [chosen]
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        raise TradeoffError.of("families", "is empty; name at least one rule family")
    bad = next((c for c in chosen if c not in known), None)
    if bad is not None:
        raise TradeoffError.of("families", f"{show(bad)} is not a rule family {where}; "
                                           f"expected one of {', '.join(known)}")
    return chosen


def is_task(data_dir: Path) -> bool:
    """Whether a directory holds task traces (``evolve data task``)."""
    path = Path(data_dir) / "valid.npz"
    if not path.is_file():
        return False
    meta = traces.read_file_meta(path)
    return isinstance(meta, dict) and meta.get("backend") == "task"


def _share(param: str, value, optional: bool = True):
    if value is None and optional:
        return None
    ok = isinstance(value, Real) and not isinstance(value, bool)
    v = float(value) if ok else math.nan
    if not 0 <= v <= 1:
        raise TradeoffError.of(param, f"{show(value)} is invalid; expected a share in [0, 1]")
    return v


def task_tradeoff(data_dir: Path, budgets, runs=(), runs_dir=None, engine=None,
                  prompts=None, agreement_budget=None, any_scope=False,
                  progress=None, oracle: bool | int = False, chosen=None,
                  draft_cost: float | str | None = "measure") -> TaskTradeoff:
    """``tradeoff`` on task traces (see there)."""
    from evolve.freerun import task_compare           # lazy: the task world on use
    from evolve.data.sources.task import pair as TP   # lazy: as above
    from evolve.data.sources.task import record       # lazy: as above
    from evolve.objectives.task_data import TaskData    # lazy: as above
    for b in budgets:
        _share("budgets", b, optional=False)
    agreement_budget = _share("agreement_budget", agreement_budget)
    if draft_cost not in (None, "measure") and not (isinstance(draft_cost, (int, float))
                                       and not isinstance(draft_cost, bool)
                                       and math.isfinite(draft_cost) and draft_cost >= 0):
        raise TradeoffError.of("draft_cost", f"{show(draft_cost)} is invalid; expected the "
                                             "draft's cost per token relative to a target "
                                             "call, a number >= 0, or 'measure'")
    if not (isinstance(oracle, bool) or isinstance(oracle, int) and oracle >= 2):
        raise TradeoffError.of("oracle", f"{show(oracle)} is invalid; expected True, False "
                                         "or a whole number of test problems >= 2")
    if prompts is not None and not (isinstance(prompts, int) and not isinstance(prompts, bool)
                                    and prompts >= 2):
        raise TradeoffError.of("prompts", f"{show(prompts)} is invalid; expected a whole "
                                          "number >= 2")
    if engine is not None and engine not in ENGINES:
        raise TradeoffError.of("engine", f"{show(engine)} is invalid; expected one of "
                                         f"{', '.join(ENGINES)}")
    t0 = time.perf_counter()
    splits = {s: record.load(data_dir, s) for s in ("train", "valid", "test")}
    meta = splits["valid"].meta
    scope = traces.scope_of(meta)
    greedy = meta["decoding"] == "greedy"
    if isinstance(runs, (str, bytes)) or not hasattr(runs, "__iter__"):
        runs = [runs]
    champions, infos = {}, []
    parent = paths.runs_dir(runs_dir)
    for r in {str(getattr(r, "path", r)): r for r in runs}.values():
        rule, info = in_scope(*run_rule(parent, r), scope, any_scope, "runs")
        champions[info["label"]] = rule.nodes
        infos.append(info)
    names = table_families("task", meta["decoding"])
    picked = chosen_families(chosen, names + [JUDGE_FAMILY],
                             f"of task traces decoded {meta['decoding']}")
    if engine is not None:
        names = [n for n in engine_families(engine, "task") if n in names]
    if picked is not None:
        names = [n for n in names if n in picked]
    pair = TP.rebuild(meta)
    say = progress or (lambda text: None)
    res = task_compare.tradeoff(pair, TaskData(splits["train"]), budgets, champions, greedy,
                                names, prompts, agreement_budget, say, oracle,
                                judge=picked is None or JUDGE_FAMILY in picked)
    measured = None
    if draft_cost == "measure":               # where the pair has models to time
        timer = getattr(pair, "step_cost", None)
        measured = timer() if timer is not None else None
        draft_cost = None if measured is None else measured["draft_cost"]
    if draft_cost is not None:
        res = task_compare.with_time(res, float(draft_cost), int(meta["block_size"]),
                                     measured)
    sizes = {s: len(pair.problems[s]) for s in ("train", "valid", "test")}
    report = {"data": str(data_dir), "task": True, "sizes": sizes, **res, "runs": infos,
              "engine": engine, "agreement_budget": agreement_budget,
              "seconds": round(time.perf_counter() - t0, 3)}
    return TaskTradeoff(report)
