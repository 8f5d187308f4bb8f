"""The emitted token's exact distribution under an acceptance rule, at one drafted slot.

At a slot with target distribution ``p`` and draft distribution ``q`` (full
vocabulary), a rule accepts a drafted token ``x`` with probability ``a(x)``: the
rule's clipped threshold for the draft's top-k tokens, the standard
``min(1, p / q)`` for the others (as both decoders apply it). The emitted token
is then distributed as ``out = q a + (1 - beta) r`` with ``beta = sum(q a)`` and
``r = norm(max(0, p - q))``; its TV and KL from ``p`` are the slot's distortion.
An engine's knob (``evolve.data.decode.judges_every_draft``) judges every token
of the vocabulary. A rule whose ``residual`` is ``target_without_draft`` (SGLang's target-only
verification) judges every token of the vocabulary, and a rejection of ``x``
resamples from p with x removed; then

    out(y) = q(y) a(y) + p(y) S - q(y) (1 - a(y)) p(y) / (1 - p(y)),
    S      = sum_x q(x) (1 - a(x)) / (1 - p(x))

(a token with 1 - p(x) < RESIDUAL_EPS resamples from p itself).
Pair-independent: the n-gram simulation and paired comparison
(``evolve.simulate``, ``evolve.paired``) and the Hugging Face decoder
(``evolve.data.sources.hf_decode``) all use these functions.
"""

from __future__ import annotations

import numpy as np

from evolve.data.decode import (RESIDUAL_EPS, STANDARD, WITHOUT_DRAFT, clipped,
                                entropy, judges_every_draft, residual, residual_kind,
                                slot_features, top_candidates)
from evolve.lang.features import ALL_INPUT_NAMES


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
            "p_max": per_row(p.max(axis=1)), "q_max": per_row(q.max(axis=1)),
            **{f: per_row(v) for f, v in slot_features(p, q).items()}}


def acceptance(p: np.ndarray, q: np.ndarray, F: dict, rule, k: int) -> np.ndarray:
    """a(x) for every token: the rule (a ``many(features)`` rule of
    ``evolve.rules.adapters``) on the draft's top-k, the standard rule elsewhere."""
    M, V = p.shape
    a = clipped(rule.many({f: F[f].reshape(-1) for f in ALL_INPUT_NAMES})).reshape(M, V)
    if judges_every_draft(rule):              # an engine's knob: every token by the rule
        return a
    in_top = np.zeros((M, V), dtype=bool)
    np.put_along_axis(in_top, top_candidates(q, k), True, axis=1)
    return np.where(in_top, a, np.minimum(1.0, p / q))


def exact_output(p: np.ndarray, q: np.ndarray, a: np.ndarray,
                 residual_of: str = STANDARD) -> np.ndarray:
    """The emitted token's distribution over the full vocabulary: q a + (1 - beta) r
    (standard residual), or the target-only form above (``residual_of`` =
    ``WITHOUT_DRAFT``)."""
    if residual_of == WITHOUT_DRAFT:
        w = q * (1.0 - a)
        rest = 1.0 - p
        normal = rest >= RESIDUAL_EPS
        with np.errstate(divide="ignore", invalid="ignore"):
            own = np.where(normal, w / np.where(normal, rest, 1.0), 0.0)
        S = (own + np.where(normal, 0.0, w)).sum(axis=1)
        return q * a + p * S[:, None] - own * p
    if residual_of != STANDARD:
        raise ValueError(f"unknown residual {residual_of!r}")
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
    return distortion(p, exact_output(p, q, acceptance(p, q, F, rule, k), residual_kind(rule)))
