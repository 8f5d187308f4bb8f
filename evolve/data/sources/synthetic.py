"""The seed-compatible synthetic generator.

It follows the distributional model of the original benchmark (see the README,
"Data"): per split, ``num_sequences`` sequences of length 25 + floor(50 U); per
token a Bernoulli(0.72) top-token match, a Beta-shaped draft probability and a
target probability, entropies and the pre-drawn uniform of the accept test.

The original drew from a ChaCha8 stream; we draw from numpy's PCG64 seeded with
the same seeds, so token counts differ slightly from the original's while every
distribution is the same. Uniforms are drawn column by column, so the output
is a pure function of (seed, num_sequences) and identical bit for bit on every
machine numpy supports.
"""

from __future__ import annotations

import numpy as np

from evolve.data.tokens import Dataset, from_columns

DEFAULT_SEQUENCES = {"train": 1000, "valid": 300, "test": 300}
DEFAULT_SEEDS = {"train": 42, "valid": 123, "test": 456}
MATCH_PROB = 0.72


def generate(num_sequences: int, seed: int, name: str = "") -> Dataset:
    if num_sequences <= 0:
        raise ValueError(f"num_sequences must be positive, got {num_sequences}")
    rng = np.random.Generator(np.random.PCG64(seed))
    lengths = 25 + np.floor(50.0 * rng.random(num_sequences)).astype(np.int64)
    n = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    position = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)

    match = rng.random(n) < MATCH_PROB
    a = np.where(position < 5, 3.0, 2.0)
    draft = 0.05 + 0.9 * rng.beta(a, 1.5)
    u1, u2, u3 = rng.random(n), rng.random(n), rng.random(n)
    t_match = np.clip(0.85 * draft + 0.15 * u1 + (0.3 * u2 - 0.15), 0.01, 0.99)
    t_miss = np.clip(draft * (1.0 - (0.3 + 0.5 * u3)), 0.01, 0.5)
    target = np.where(match, t_match, t_miss)

    base = 2.0 + 4.0 * rng.random(n)
    draft_entropy = base * (1.0 + 0.3 * rng.random(n))
    u4 = rng.random(n)
    target_entropy = np.where(match, base * (0.8 + 0.3 * u4), base * (1.0 + 0.5 * u4))

    rand_value = rng.random(n)
    accepts = rand_value < np.minimum(1.0, target / draft)
    return from_columns({
        "draft_prob": draft,
        "target_prob": target,
        "position": position,
        "draft_entropy": draft_entropy,
        "target_entropy": target_entropy,
        "top_token_match": match,
        "rand_value": rand_value,
        "baseline_accepts": accepts,
    }, source=f"<generated seed={seed}>", name=name)


def generate_splits(seeds: dict[str, int] | None = None,
                    sequences: dict[str, int] | None = None) -> dict[str, Dataset]:
    seeds = {**DEFAULT_SEEDS, **(seeds or {})}
    sequences = {**DEFAULT_SEQUENCES, **(sequences or {})}
    return {s: generate(sequences[s], seeds[s], name=s) for s in DEFAULT_SEQUENCES}
