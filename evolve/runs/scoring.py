"""Scoring compiled heuristics on splits: metrics and evaluation time.

One path serves `evolve benchmark`, the champion's metrics in champion.json and
write-back decisions, so their numbers agree exactly.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from evolve.kernels.tokens import TokenArrays
from evolve.objectives.tokens import threshold_counts

DEFAULT_REPEATS = 25


class PreparedSplit:
    """A split with its feature columns and kernel arrays, made once."""

    def __init__(self, ds):
        self.ds = ds
        self.n = len(ds)
        self.features = ds.features()
        self.arrays = TokenArrays(ds)
        self.out = np.empty(self.n, dtype=np.float64)


def score(ufunc, split: PreparedSplit, repeats: int = DEFAULT_REPEATS) -> dict:
    """Metrics of a compiled heuristic on a split, plus eval_ms (median of repeats).

    The timed work is the whole evaluation: thresholds for every token and the
    decision counts the metrics need.
    """
    h = ufunc(*split.features, out=split.out)
    metrics = threshold_counts(h, split.arrays).metrics()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        ufunc(*split.features, out=split.out)
        threshold_counts(split.out, split.arrays)
        times.append(time.perf_counter() - t0)
    metrics["eval_ms"] = statistics.median(times) * 1e3
    return metrics
