"""The emitted token's exact distribution under an acceptance rule, at one drafted slot.

At a slot with target distribution ``p`` and draft distribution ``q`` (full
vocabulary), a rule accepts a drafted token ``x`` with probability ``a(x)``: the
rule's clipped threshold for the draft's top-k tokens, the standard
``min(1, p / q)`` for the others (as both decoders apply it). The emitted token
is then distributed as ``out = q a + (1 - beta) r`` with ``beta = sum(q a)`` and
``r = norm(max(0, p - q))``; its TV and KL from ``p`` are the slot's distortion.
Pair-independent: the n-gram simulation and paired comparison
(``evolve.simulate``, ``evolve.paired``) and the Hugging Face decoder
(``evolve.data.sources.hf_decode``) all use these functions.
"""

from __future__ import annotations

import numpy as np

from evolve.data.decode import clipped, residual, top_candidates
from evolve.data.sources.ngram_lm import entropy
from evolve.lang.features import TRACE_INPUT_NAMES


def vocab_features(p: np.ndarray, q: np.ndarray, positions, block_positions) -> dict:
    """The (M, V) rule features of every token of the vocabulary at M slots."""
    M, V = p.shape

    def per_row(x):
        return np.repeat(np.asarray(x)[:, None], V, axis=1)

    top = np.argmax(p, axis=1)
    return {"draft_prob": q, "target_prob": p,
            "position": per_row(np.asarray(positions, np.int64)),
            "draft_entropy": per_row(entropy(q)), "target_entropy": per_row(entropy(p)),
            "top_token_match": np.arange(V)[None, :] == top[:, None],
            "block_position": per_row(np.asarray(block_positions, np.int64)),
            "p_max": per_row(p.max(axis=1)), "q_max": per_row(q.max(axis=1))}


def acceptance(p: np.ndarray, q: np.ndarray, F: dict, rule, k: int) -> np.ndarray:
    """a(x) for every token: the rule (a ``many(features)`` rule of
    ``evolve.rules.adapters``) on the draft's top-k, the standard rule elsewhere."""
    M, V = p.shape
    a = clipped(rule.many({f: F[f].reshape(-1) for f in TRACE_INPUT_NAMES})).reshape(M, V)
    in_top = np.zeros((M, V), dtype=bool)
    np.put_along_axis(in_top, top_candidates(q, k), True, axis=1)
    return np.where(in_top, a, np.minimum(1.0, p / q))


def exact_output(p: np.ndarray, q: np.ndarray, a: np.ndarray) -> np.ndarray:
    """The emitted token's distribution q a + (1 - beta) r, over the full vocabulary."""
    beta = (q * a).sum(axis=1)
    r = residual(p, q)
    r = r / r.sum(axis=1, keepdims=True)
    return q * a + (1.0 - beta)[:, None] * r


def distortion(p: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per slot: TV(out, p) and KL(out || p)."""
    tv = 0.5 * np.abs(out - p).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.maximum(np.where(out > 0, out * np.log(out / p), 0.0).sum(axis=1), 0.0)
    return tv, kl


def slot_distortion(p, q, positions, block_positions, rule, k: int):
    """(TV, KL) of the emitted token at M slots under ``rule``."""
    F = vocab_features(p, q, positions, block_positions)
    return distortion(p, exact_output(p, q, acceptance(p, q, F, rule, k)))
