"""Minibatch fitness (``--batch-blocks N``): each generation's train fitness on a
deterministic sample of N draft blocks.

The sample of generation ``t`` is drawn from ``numpy.random.default_rng([seed,
t, BATCH_STREAM])`` (the run's seed and the generation: a resume draws the same
blocks; the checkpoint records both). Every individual of a generation is
scored on that generation's sample; the hall of fame takes the generation's
best trees by sample score and scores them on the whole train split, so the
hall of fame, the elites' record and the champion (chosen on valid) are exact.
"""

from __future__ import annotations

import numpy as np

BATCH_STREAM = 0x62617463      # separates the batch stream from every other use of the seed


def sample_blocks(seed: int, generation: int, n_blocks: int, n: int) -> np.ndarray:
    """Sorted block numbers of generation ``generation``'s sample (all if n >= n_blocks)."""
    if n >= n_blocks:
        return np.arange(n_blocks, dtype=np.int64)
    rng = np.random.default_rng([seed, generation, BATCH_STREAM])
    return np.sort(rng.choice(n_blocks, size=n, replace=False)).astype(np.int64)


def best_distinct(texts: list[str], scores, sizes, k: int) -> list[int]:
    """Indices of the best ``k`` distinct trees by score (then size, then population order)."""
    order = np.lexsort((np.arange(len(texts)), sizes, -np.asarray(scores)))
    seen, out = set(), []
    for i in order.tolist():
        if texts[i] not in seen:
            seen.add(texts[i])
            out.append(i)
            if len(out) == k:
                break
    return out
