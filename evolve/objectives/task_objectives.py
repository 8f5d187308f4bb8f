"""Objectives on task traces with critical-token labels (``evolve data task``).

``task_speed``  tokens per target call where the accepted critical tokens (beyond the
                standard rule) per answer are within ``--budget-critical`` (about the
                share of answers the rule may change: 0.01 for a 1% accuracy drop);
                a rule over it scores below 1, less the further it is over
                (``fitness.speed_fitness``).
``task_seed``   the seed's metric on the labels: a false accept is an accepted critical
                token, a false reject a rejected harmless one (``task_labels.seed_fitness``).

Both are exact given the recorded blocks (``evolve.objectives.task_labels``). A
population is scored by the token kernel's thresholds of every drafted row
(``evolve.kernels.tokens.matrix_thresholds``) and the labels' block sums. The inputs
are those of traces with slot features (no lookahead) and the task world's own (the
answer and verify groups of evolve.lang.features). The splits as they are
scored are ``evolve.objectives.task_data``, loaded where they are used (Numba).
"""

from __future__ import annotations

import numpy as np

from evolve.objectives import placement
from evolve.objectives.base import TASK, Evaluator, Objective
from evolve.objectives.fitness import speed_fitness
from evolve.objectives.settings import Setting

# Read by both: task_speed's constraint, and the budget every task run's report tunes the
# rule families to (evolve.tasks.task).
CRITICAL_BUDGET = Setting("critical_budget", 0.01, 0.0, 100.0, "--budget-critical",
                          "accepted critical tokens per answer allowed (about the accuracy "
                          "drop)", "accepted critical tokens per answer, in [0, 100]",
                          meta="critical_budget")

# How a task run chooses its champion (evolve.freerun.select): free-running on this many
# problems of valid, by target calls per correct answer within the critical budget taken
# as an accuracy drop; 0 chooses on the recorded path only.
SELECT_PROBLEMS = Setting("select_problems", 64, 0, 1_000_000, "--select-problems",
                          "problems of valid on which the hall of fame's best rules, and "
                          "steps from lossless towards them, decode free-running; the "
                          "champion is the one with the fewest target calls per correct "
                          "answer within --budget-critical as an accuracy drop",
                          "a number of problems, in [0, 1000000]", meta="select_problems",
                          off=0, off_text="0: chosen on the recorded path")

# And, optionally, a bound on the answers that choice may change from lossless decoding
# (AutoJudge's criterion: it stays meaningful where the target itself is wrong).
AGREEMENT_BUDGET = Setting("agreement_budget", 1.0, 0.0, 1.0, "--budget-agreement",
                           "share of valid answers the free-running choice may change from "
                           "lossless decoding (with --select-problems)",
                           "a share of answers in [0, 1]", meta="agreement_budget", off=1.0,
                           off_text="no bound")


class TaskObjective(Objective):
    data = TASK
    trace_inputs = True        # the inputs of traces with slot features
    extra_groups = ("answer", "verify")       # and the task world's own
    settings = (CRITICAL_BUDGET, SELECT_PROBLEMS, AGREEMENT_BUDGET)

    def __init__(self, name: str, help: str, seed_metric: bool):
        self.name = name
        self.help = help
        self.weights = (1.0,)
        self.seed_metric = seed_metric

    def evaluator(self, split, name: str, config=None) -> Evaluator:
        from evolve.objectives.task_data import task_data  # lazy: start-up (Numba)
        placement.cpu_only(config, "task traces")
        td = task_data(split)
        return Evaluator(name, td.sums, td, td.n)

    def values(self, ev: Evaluator, trees, config, deap_trees=None) -> np.ndarray:
        from evolve.objectives import task_labels as TL  # lazy: start-up (Numba)
        m = TL.measures(ev.rows(trees, deap_trees))
        if self.seed_metric:
            v = TL.seed_fitness(m)
        else:
            v = speed_fitness(m["tokens_per_call"], m["critical_per_answer"],
                              config.critical_budget)
        return np.atleast_1d(np.asarray(v, dtype=np.float64))[:, None]

    def metrics(self, nodes, splits: dict, evaluators: dict) -> dict:
        from evolve.lang import treeio  # lazy: start-up (the primitive table loads Numba)
        from evolve.objectives.task_data import metrics_of, task_data  # lazy: start-up (Numba)
        from evolve.kernels.tokens import matrix_thresholds  # lazy: as above
        progs = treeio.linearise([nodes])
        out = {}
        for k, split in splits.items():
            ev = evaluators.get(k)
            td = ev.arrays if ev is not None else task_data(split)
            out[k] = metrics_of(td.sums(progs))
            whole = td.whole()                # (a sharded split: loaded for this one rule)
            out[k]["critical_by_distance"] = whole.critical_by_distance(
                matrix_thresholds(progs, whole.X))
        return out

    def split_score(self, m: dict, config) -> float:
        if self.seed_metric:
            return float(m["fitness"])
        return float(speed_fitness(m["tokens_per_call"], m["critical_per_answer"],
                                   config.critical_budget))


TASK_SPEED = TaskObjective("task_speed", f"tokens per target call within "
                           f"{CRITICAL_BUDGET.flag} (accepted critical tokens per answer; "
                           "task traces) on the labels, the champion then chosen per "
                           "answer: the fewest target calls per correct answer "
                           f"free-running on valid ({SELECT_PROBLEMS.flag})", False)
TASK_SEED = TaskObjective("task_seed", "the seed's metric on critical-token labels (task "
                          "traces)", True)
