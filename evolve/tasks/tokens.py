"""Token splits (datasets/): the original benchmark's world.

Splits are ``evolve.data.tokens`` TokenSplits; champions are scored by the seed
metric (``evolve.objectives.tokens``), judged against standard rejection and the
benchmark's baselines on valid (``standing``), and written back to
heuristics/evolved.py when they win there and their valid fitness beats the
installed rule's.
"""

from __future__ import annotations

from pathlib import Path

from evolve.tasks.base import Task
from evolve.io.paths import DATA_DIR
from evolve.data import tokens as data
from evolve.kernels.tokens import TokenArrays, population_counts
from evolve.lang import treeio
from evolve.objectives import bind
from evolve.objectives.metrics import Counts
from evolve.rules import table
from evolve.standing import INFEASIBLE, LOSES, WINS
from evolve.tasks.writeback import refusal, write_back


def standing(objective, cfg, valid_metrics: dict, valid) -> dict:
    """Where a token champion stands on valid, by the score it was chosen by (the seed
    metric, expected or counted): ``infeasible`` below standard rejection's, ``loses``
    when one of the benchmark's baselines (``evolve benchmark``'s rows) scores more,
    ``wins`` otherwise. Only a champion that wins is written back without ``--force``,
    and ``evolve export`` refuses an infeasible one unless ``--allow-infeasible``."""
    from heuristics import registry   # lazy: the rules' package, read when a run is judged
    score = float(objective.split_score(valid_metrics, cfg))
    names = registry.names(include_evolved=False)
    arrays = TokenArrays(valid)        # every baseline in one population, as run_table does
    raw = population_counts(treeio.linearise([treeio.parse(table.get(n).tree())
                                              for n in names]), arrays)
    scores = {n: float(objective.split_score(Counts.from_raw(arrays.n, r).metrics(), cfg))
              for n, r in zip(names, raw)}
    std = scores["standard_rejection"]
    best = max(scores.items(), key=lambda kv: kv[1])
    what = "expected fitness" if objective.expected else "fitness"
    out = {"valid_score": score, "standard_rejection": std,
           "best_baseline": {"rule": best[0], "score": best[1]}}
    if score < std:
        return {**out, "verdict": INFEASIBLE,
                "why": f"below standard rejection on valid ({what} {score:.4f} vs {std:.4f})"}
    if best[1] > score:
        return {**out, "verdict": LOSES,
                "why": f"{best[0]} scores more on valid ({what} {best[1]:.4f} vs {score:.4f})"}
    return {**out, "verdict": WINS,
            "why": f"scores at least standard rejection and every baseline on valid "
                   f"({what} {score:.4f})"}


class TokenTask(Task):
    name = "tokens"
    trace_inputs = False
    module = "evolved"
    installed = "tokens"
    writes_back = "`evolve run` writes one back"
    figure = "fitness"
    metric_keys = ("accept_rate", "accuracy", "quality", "fitness")

    def default_data(self) -> Path:
        return DATA_DIR

    def load_splits(self, config, data_dir: Path, session=None) -> dict:
        if session is not None and session.distributed:
            session.attach({})          # raises: a cluster needs sharded traces
        return data.load_splits(data_dir)

    def report(self, result) -> dict:
        return {"champion": {"standing": standing(bind(result.config), result.config,
                                                  result.metrics["valid"],
                                                  result.splits["valid"])},
                "files": {}}

    def install(self, nodes, source, meta, valid_metrics, valid, evaluator, config,
                run_name, opts):
        refused = refusal(meta, opts.force, "evolved.py")
        if refused is not None:
            return {**refused, "new_valid_fitness": valid_metrics["fitness"]}
        return write_back(source, valid_metrics["fitness"], valid, run_name,
                          force=opts.force, directory=opts.heuristics_dir)
