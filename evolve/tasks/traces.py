"""Speculative-decoding traces (datasets/traces/): in memory (.npz) or sharded.

Splits are ``evolve.data.traces`` TraceSplits, or shards scored where they are
(``evolve.data.shards``, ``evolve.cluster``); champions are scored by the trace
objectives (``evolve.objectives.trace_objectives``), reported beside every rule family
tuned to the run's budget, and written back to heuristics/evolved_trace.py when
their valid speed score beats the installed trace rule's.
"""

from __future__ import annotations

from pathlib import Path

from evolve.tasks.base import Task
from evolve.io.paths import TRACES_DIR
from evolve.cluster.session import Session
from evolve.data import shards, traces
from evolve.data.tokens import DataError
from evolve.search.config import ConfigError
from evolve.lang import codegen, treeio
from evolve.lang import primitives as P
from evolve.objectives import bind
from evolve.objectives.splits import spec_arrays
from evolve.rules import tuning
from evolve.rules.table import RULES
from evolve.standing import INFEASIBLE, LOSES, WINS
from evolve.tasks.writeback import refusal, write_back_trace

HEADER_KEYS = ("tokens_per_call", "tv_per_token")
ESTIMATE = ("the champion reads a lookahead input (next_tv, ahead), which follows the token "
            "drafted at its slot: its numbers hold those inputs at the recorded draft's "
            "values for every candidate, an estimate; `evolve simulate --compare` measures "
            "it free-running")



def standing(objective, cfg, valid: dict, sa_valid, tuned: dict) -> dict:
    """Where a champion stands on valid, by the score it was chosen by: ``infeasible``
    when it is over the run's budget (or a cap) or decodes fewer tokens per call than
    standard rejection; else ``loses`` when a rule family tuned on valid to the same
    budget (``tuned``: ``tuning.tuned_report`` by family) decodes more, ``wins``
    otherwise. Only a champion that wins is written back without ``--force``, and
    ``evolve export`` refuses an infeasible one unless told otherwise."""
    score = float(objective.split_score(valid, cfg))
    std = float(tuning.evaluate("standard_rejection", sa_valid).tokens)
    best = max(((name, rep) for name, rep in tuned.items() if rep is not None),
               key=lambda nr: nr[1]["valid"]["tokens_per_call"], default=None)
    out = {"valid_score": score, "standard_rejection": std,
           "best_tuned": None if best is None else
           {"rule": best[0], "param": best[1]["param"],
            "tokens_per_call": best[1]["valid"]["tokens_per_call"]}}
    measure, budget = objective.budget_of(cfg)
    dist = f"{measure.upper()} {budget:g}"
    if score < 1.0:       # speed_fitness: a rule over its budget or a cap scores below 1
        m = (valid.get("trajectory") or {}) if cfg.trajectory else valid
        key = f"{measure}_per_token"
        got = m.get(key)
        over = []
        if isinstance(got, float) and got > budget:
            over.append(f"{key.replace('_per_token', '').upper()} per token {got:.5f} > "
                        f"{budget:g}")
        k, first = cfg.first_tokens, valid.get("tv_first")
        if cfg.tv_first_cap < 1.0 and first and first[k - 1] > cfg.tv_first_cap:
            over.append(f"TV over the first {k} token{'s' if k > 1 else ''} after the "
                        f"prompt {first[k - 1]:.5f} > {cfg.tv_first_cap:g}")
        what = "; ".join(over) or ("a cap (--cap-tv-position, --cap-tv-p99) or the "
                                   "trajectory guard")
        return {**out, "verdict": INFEASIBLE, "why": f"over the run's budget on valid ({what})"}
    if score < std:
        return {**out, "verdict": INFEASIBLE,
                "why": f"below standard rejection on valid ({score:.4f} vs {std:.4f} "
                       "tokens per call)"}
    if best is not None and out["best_tuned"]["tokens_per_call"] > score:
        b = out["best_tuned"]
        label = RULES[b["rule"]].label(b["param"]) if b["rule"] in RULES else b["rule"]
        return {**out, "verdict": LOSES,
                "why": f"{label}, tuned to the same budget, decodes more on valid "
                       f"({b['tokens_per_call']:.4f} vs {score:.4f} tokens per call)"}
    return {**out, "verdict": WINS,
            "why": f"beats standard rejection and every rule family tuned to {dist} on "
                   f"valid ({score:.4f} tokens per call)"}


class TraceTask(Task):
    name = "traces"
    trace_inputs = True
    module = "evolved_trace"
    header_keys = HEADER_KEYS
    installed = "trace"
    writes_back = "`evolve run --objective speed` writes one back"
    figure = "tokens_per_call"
    metric_keys = ("tokens_per_call", "tv_per_token", "kl_per_token")

    def default_data(self) -> Path:
        return TRACES_DIR

    def load_splits(self, config, data_dir: Path, session=None) -> dict:
        session = session or Session()
        if shards.is_sharded(data_dir):
            return session.attach(shards.load_splits(data_dir))
        session.attach({})
        if not Path(data_dir).is_dir():
            raise DataError(f"{data_dir}: no trace data (record it with `evolve data trace`, "
                            "about 3 s)")
        train = Path(data_dir) / "train.npz"
        if train.exists() and traces.is_token_file(train):
            raise ConfigError.of("objective", f"{config.objective!r} needs speculative-"
                                 "decoding traces (make them with `evolve data trace`); "
                                 f"{data_dir} holds token splits")
        return traces.load_splits(data_dir)     # any other file: its own precise error

    def report(self, result) -> dict:
        """What a finished trace run adds (``result``: an ``evolve.tasks.Finished``):
        the baselines tuned on valid to the run's budget (reported on test), the
        trade-off on valid and, for NSGA-II, the final non-dominated front on every
        split."""
        # lazy: start-up (listing tasks loads neither the rules nor Numba)
        objective = bind(result.config)
        cfg, metrics = result.config, result.metrics
        sas = {k: spec_arrays(k, result.splits, result.evaluators)
               for k in ("train", "valid", "test")}
        budget = cfg.tv_budget          # the trade-off's: TV per token is its axis
        measure, tuned_budget = objective.budget_of(cfg)
        tuned = {name: tuning.tuned_report(name, sas["valid"], sas["test"], tuned_budget,
                                           measure=measure)
                 for name in tuning.families()
                 if tuning.scorable(name, sas["valid"]) is None}   # exact on these traces
        hof_trees = list(result.hof_trees)
        hof_tok, hof_tv = objective.tokens_tv(result.evaluators["valid"], hof_trees)
        sweep = tuning.sweep_all(sas["valid"])
        series = tuning.series_of(sweep)
        series["hall of fame"] = sorted(zip(hof_tv.tolist(), hof_tok.tolist()))
        files = {}
        front = objective.front(result.population, sas)
        if front is not None:
            files["pareto_front.json"] = front
            series["evolved front (NSGA-II)"] = sorted(
                (f["valid"]["tv_per_token"], f["valid"]["tokens_per_call"]) for f in front)
        series["champion"] = [(metrics["valid"]["tv_per_token"],
                               metrics["valid"]["tokens_per_call"])]
        files["pareto.json"] = {
            "split": "valid", "budget": budget,
            "baselines": [p.to_dict() for p in sweep],
            "hall_of_fame": [{"tree": t, "expression": codegen.infix(treeio.parse(t)),
                              "tokens_per_call": float(a), "tv_per_token": float(b)}
                             for t, a, b in zip(hof_trees, hof_tok, hof_tv)],
            "series": {k: [list(xy) for xy in v] for k, v in series.items()},
        }
        champion = {"baselines_tuned_on_valid": tuned}
        if P.uses_lookahead_inputs(result.nodes):
            champion["estimate"] = ESTIMATE
        champion["scope"] = traces.scope_of(result.splits["valid"].meta)
        champion["standing"] = standing(objective, cfg, metrics["valid"], sas["valid"], tuned)
        return {"champion": champion,
                "files": files, "series": series}

    def install(self, nodes, source, meta, valid_metrics, valid, evaluator, config,
                run_name, opts):
        refused = refusal(meta, opts.force, "evolved_trace.py")
        if refused is not None:
            return {**refused, "tv_budget": config.tv_budget}
        sa = spec_arrays("valid", {"valid": valid}, {"valid": evaluator})
        return write_back_trace(codegen.module_source(
            nodes, "evolved_trace", meta, f"Evolved trace acceptance rule (run {run_name})",
            trace=True), nodes, sa, config.tv_budget, run_name,
            force=opts.force, directory=opts.heuristics_dir)

    def runs_text(self, row: dict, split: str) -> str:
        return (f"{row[f'{split}_tokens_per_call']:.3f} tok/call, "
                f"TV {row[f'{split}_tv_per_token']:.4f}")
