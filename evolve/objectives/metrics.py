"""Metrics of an acceptance rule on one split, from counts.

The seed metric (the original benchmark's), for N tokens:

    acceptance_rate = accepted / N
    accuracy        = (N - FA - FR) / N
    quality         = max(0, 1 - (10 FA/N + 0.1 FR/N))
    fitness         = acceptance_rate * quality   if quality >= 0.95
                      0.5 * quality               otherwise

A token is accepted iff ``rand_value < threshold``; a NaN threshold therefore
rejects. The *expected* variant replaces the single uniform draw by its
expectation under the coupling with the standard rule's own uniform: with
p = clip(threshold, 0, 1) (NaN -> 0) and s = min(1, target/draft),
E[accept] = p, E[FA] = max(0, p - s), E[FR] = max(0, s - p). It is the same
formula with noise-free counts, so selection is not steered by the particular
``rand_value`` draws. Expected sums are accumulated in fixed point: each
token's p and s are truncated to multiples of 2^-32 and summed as integers,
which is exact and independent of summation order, so the kernel, the
benchmark and the reference agree to the bit whatever the thread count.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evolve.data.decode import clipped
from evolve.kernels.layout import EXPECTED_SCALE, quantise

FA_WEIGHT = 10.0
FR_WEIGHT = 0.1
QUALITY_GATE = 0.95

# Keys of one split's metrics, shared by `evolve benchmark --json` and champion.json.
METRIC_KEYS = ("accept_rate", "accuracy", "quality", "fitness", "false_accepts",
               "false_rejects", "expected_accept_rate", "expected_fitness")


def quality(n, fa, fr):
    n = np.asarray(n, dtype=np.float64)
    return np.maximum(0.0, 1.0 - (FA_WEIGHT * np.asarray(fa) / n + FR_WEIGHT * np.asarray(fr) / n))


def fitness(n, accepted, fa, fr):
    """Seed-metric fitness; works on scalars or arrays of counts."""
    q = quality(n, fa, fr)
    rate = np.asarray(accepted, dtype=np.float64) / n
    out = np.where(q >= QUALITY_GATE, rate * q, 0.5 * q)
    return out if out.ndim else float(out)


@dataclass(frozen=True)
class Counts:
    """Everything the metrics need: decision counts and expected sums."""
    n: int
    accepted: int
    false_accepts: int
    false_rejects: int
    expected_accepted: float
    expected_fa: float
    expected_fr: float

    @classmethod
    def from_raw(cls, n: int, raw) -> "Counts":
        """From a kernel row: 3 decision counts, 3 fixed-point expected sums."""
        return cls(n, int(raw[0]), int(raw[1]), int(raw[2]), int(raw[3]) / EXPECTED_SCALE,
                   int(raw[4]) / EXPECTED_SCALE, int(raw[5]) / EXPECTED_SCALE)

    def metrics(self) -> dict:
        n = self.n
        return {
            "accept_rate": self.accepted / n,
            "accuracy": (n - self.false_accepts - self.false_rejects) / n,
            "quality": float(quality(n, self.false_accepts, self.false_rejects)),
            "fitness": fitness(n, self.accepted, self.false_accepts, self.false_rejects),
            "false_accepts": int(self.false_accepts),
            "false_rejects": int(self.false_rejects),
            "expected_accept_rate": self.expected_accepted / n,
            "expected_fitness": fitness(n, self.expected_accepted, self.expected_fa,
                                        self.expected_fr),
        }


clip01 = clipped      # clip(h, 0, 1) with NaN -> 0: the one definition, shared with decoding


def counts_from_thresholds(threshold, rand_value, baseline_accepts, standard) -> Counts:
    """Counts of a threshold array (numpy; the obvious way, used as reference)."""
    h = np.broadcast_to(np.asarray(threshold, dtype=np.float64), np.shape(rand_value))
    acc = rand_value < h
    b = baseline_accepts
    q = quantise(clip01(h))
    d = q - quantise(standard)
    raw = [int(acc.sum()), int((acc & ~b).sum()), int((~acc & b).sum()),
           int(q.sum()), int(np.maximum(d, 0).sum()), int(np.maximum(-d, 0).sum())]
    return Counts.from_raw(int(h.shape[0]), raw)
