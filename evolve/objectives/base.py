"""What every objective provides, and the evaluator that scores trees with a kernel.

An ``Objective`` names what a run maximises and on which data: its DEAP fitness
weights (one objective, or several for NSGA-II), an evaluator for a split (a
population kernel over linearised trees), the fitness values of trees, one
score per individual (for the hall of fame, elites and history), and the
metrics of a champion on every split, and the settings it reads (budgets, caps:
``evolve.objectives.settings``, declared in its module). ``evolve.objectives.OBJECTIVES``
holds every objective by name; a new objective is one module here and one line there.

Objective modules import numpy only; the language, kernels and DEAP are
imported where they are used, so the command line can list the objectives
without loading Numba.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

import numpy as np

TOKENS = "tokens"      # data kinds: token splits (datasets/), or speculative-decoding traces
TRACES = "traces"
TASK = "task"            # tasks with checked answers (evolve.tasks.task)


class Evaluator:
    """Scores trees on one split with a population kernel, caching rows by tree text.

    ``kernel(programs) -> rows`` (one row of sums per program); ``arrays`` is the
    split as the kernel reads it; ``rows_per_program`` counts node evaluations;
    ``batch(blocks)``, where the split can be scored by blocks, gives an evaluator
    over some of its blocks (``--batch-blocks``)."""

    CACHE_LIMIT = 100_000

    def __init__(self, name: str, kernel: Callable, arrays, rows_per_program: int,
                 batch: Callable | None = None):
        self.name = name
        self.kernel = kernel
        self.arrays = arrays
        self.rows_per_program = rows_per_program
        self.batch = batch                    # blocks -> an evaluator over those blocks
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.kernel_seconds = 0.0
        self.kernel_programs = 0
        self.node_evals = 0

    def run(self, progs) -> np.ndarray:
        """Kernel rows for linearised programs (not cached), timed and counted."""
        t0 = time.perf_counter()
        rows = self.kernel(progs)
        self.kernel_seconds += time.perf_counter() - t0
        self.kernel_programs += len(progs)
        self.node_evals += int(progs.lengths.sum()) * self.rows_per_program
        return rows

    def rows(self, trees: list[str], deap_trees: list | None = None) -> np.ndarray:
        """Kernel rows for tree strings, computing only the unknown (``deap_trees``:
        the same trees as DEAP individuals, read instead of parsing the strings)."""
        todo: dict[str, int] = {}
        cache = self.cache
        for i, s in enumerate(trees):
            if s not in cache and s not in todo:
                todo[s] = i
        if todo:
            from evolve.lang import treeio    # lazy: start-up (the primitive table loads Numba)
            node_lists = [treeio.from_deap(deap_trees[i]) if deap_trees is not None
                          else treeio.parse(s) for s, i in todo.items()]
            rows = self.run(treeio.linearise(node_lists))
            for j, s in enumerate(todo):
                cache[s] = rows[j].copy()
        out = np.stack([cache[s] for s in trees]) if trees else np.empty((0, 0))
        # forget the oldest only now: more new trees than the limit are still answered
        while len(cache) > self.CACHE_LIMIT:
            cache.popitem(last=False)
        return out


class Objective:
    """Base class; see the module docstring. Subclasses set the class attributes."""

    name: str = ""
    data: str = TOKENS              # its data world: a key of evolve.tasks.TASKS
    weights: tuple = (1.0,)         # DEAP fitness weights
    help: str = ""
    settings: tuple = ()            # the settings it reads (evolve.objectives.settings)

    @property
    def multi(self) -> bool:
        """Several objectives at once (NSGA-II)."""
        return len(self.weights) > 1

    @property
    def traces(self) -> bool:
        return self.data == TRACES

    extra_groups: tuple = ()    # input groups of its own world (evolve.lang.features)

    @property
    def trace_inputs(self) -> bool:
        """Its rules read the trace inputs (block position, p_max, q_max, the slot
        features): the trace objectives, and those of other worlds that say so."""
        return self.traces

    def evaluator(self, split, name: str, config=None) -> Evaluator:
        """The split's evaluator (``config``: the run's, for what the kernel must sum)."""
        raise NotImplementedError

    def values(self, ev: Evaluator, trees: list[str], config, deap_trees=None) -> np.ndarray:
        """Fitness values of trees, float (n, len(weights)), unweighted."""
        raise NotImplementedError

    def scores(self, values: np.ndarray, config) -> np.ndarray:
        """One number per individual, higher is better (hall of fame, elites, history)."""
        return np.asarray(values, dtype=np.float64)[:, 0]

    def metrics(self, nodes, splits: dict, evaluators: dict) -> dict:
        """The champion's metrics on every split (split name -> dict of numbers)."""
        raise NotImplementedError

    def split_score(self, m: dict, config) -> float:
        """The score of a champion from its metrics on one split (``metrics``), the
        number champions of several runs are compared by (on valid)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<objective {self.name}>"
