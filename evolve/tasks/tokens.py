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
from evolve.tasks.writeback import write_back

WINS, LOSES, INFEASIBLE = "wins", "loses", "infeasible"


def standing(objective, cfg, valid_metrics: dict, valid) -> dict:
    """Where a token champion stands on valid, by the score it was chosen by (the seed
    metric, expected or counted): ``infeasible`` below standard rejection's, ``loses``
    when one of the benchmark's baselines (``evolve benchmark``'s rows) scores more,
    ``wins`` otherwise. Only a champion that wins is written back without ``--force``,
    and ``evolve export`` refuses an infeasible one unless ``--allow-infeasible``."""
    from heuristics import registry       # lazy: start-up (listing tasks loads no rules)
    from evolve.lang import treeio        # lazy: start-up (listing tasks loads no rules)
    from evolve.objectives.tokens import champion_counts    # lazy: start-up (Numba)
    from evolve.rules import table        # lazy: start-up (listing tasks loads no rules)
    score = float(objective.split_score(valid_metrics, cfg))
    scores = {n: float(objective.split_score(
        champion_counts(treeio.parse(table.get(n).tree()), valid).metrics(), cfg))
        for n in registry.names(include_evolved=False)}
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
        from evolve.objectives import bind    # lazy: start-up (it loads the objectives)
        return {"champion": {"standing": standing(bind(result.config), result.config,
                                                  result.metrics["valid"],
                                                  result.splits["valid"])},
                "files": {}}

    def install(self, nodes, source, meta, valid_metrics, valid, evaluator, config,
                run_name, opts):
        st = meta.get("standing") or {}
        if st.get("verdict", WINS) != WINS and not opts.force:
            return {"written": False, "module": "evolved.py", "refused": st["verdict"],
                    "why": st["why"], "new_valid_fitness": valid_metrics["fitness"],
                    "current_valid_fitness": None}
        return write_back(source, valid_metrics["fitness"], valid, run_name,
                          force=opts.force, directory=opts.heuristics_dir)
