"""Objectives on token splits: the original benchmark's metric and its expectation.

``seed``: the seed metric (evolve.objectives.metrics) counted with each token's
pre-drawn uniform. ``expected``: the same formula with the expected counts
under the coupling with the standard rule, so selection is not steered by the
particular draws. Both are scored by the token kernel
(``evolve.kernels.tokens.population_counts``); a champion's metrics on every
split come from the kernel's thresholds of its parsed tree, the same counts
``evolve benchmark`` computes for the installed rule.
"""

from __future__ import annotations

import numpy as np

from evolve.kernels.layout import EXPECTED_SCALE
from evolve.objectives import metrics as M
from evolve.objectives.base import TOKENS, Evaluator, Objective
from evolve.objectives import placement


class TokenObjective(Objective):
    data = TOKENS

    def __init__(self, name: str, expected: bool, help: str):
        self.name = name
        self.expected = expected
        self.help = help

    def evaluator(self, split, name: str, config=None) -> Evaluator:
        return placement.token_evaluator(split, name, config)

    def values(self, ev: Evaluator, trees, config, deap_trees=None) -> np.ndarray:
        c = ev.rows(trees, deap_trees)
        n = ev.arrays.n
        if self.expected:
            e = c[:, 3:6] / EXPECTED_SCALE
            f = M.fitness(n, e[:, 0], e[:, 1], e[:, 2])
        else:
            f = M.fitness(n, c[:, 0], c[:, 1], c[:, 2])
        return np.atleast_1d(np.asarray(f, dtype=np.float64))[:, None]

    def metrics(self, nodes, splits: dict, evaluators: dict) -> dict:
        return {name: champion_counts(nodes, ds).metrics() for name, ds in splits.items()}

    def split_score(self, m: dict, config) -> float:
        return float(m["expected_fitness" if self.expected else "fitness"])


def champion_counts(nodes, ds) -> M.Counts:
    """Counts of a parsed tree on a token split, from the kernel's thresholds."""
    from evolve.kernels.tokens import TokenArrays, population_thresholds  # lazy: start-up
    from evolve.lang import treeio    # lazy: start-up (the primitive table loads Numba)
    arrays = TokenArrays(ds)
    h = population_thresholds(treeio.linearise([nodes]), arrays)[0]
    return threshold_counts(h, arrays)


def threshold_counts(h, arrays) -> M.Counts:
    """Counts of a threshold array on a split prepared for the kernels
    (``evolve.kernels.tokens.TokenArrays``), tallied as the population kernel does."""
    from evolve.kernels.tokens import threshold_tally       # lazy: start-up (Numba)
    return M.Counts.from_raw(arrays.n, threshold_tally(h, arrays))


EXPECTED = TokenObjective("expected", True, "the seed metric with expected counts "
                          "(noise-free; the default)")
SEED = TokenObjective("seed", False, "the original benchmark's metric")
