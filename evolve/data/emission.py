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
The lookahead inputs (``evolve.data.decode.lookahead_features``: ``next_tv``,
``ahead``) are properties of the path, the block's later drafted slots, not of the
token judged at the slot: the caller that has the block passes them per slot
(``lookahead``), and they are the same for every token of the vocabulary there
(the emission of a lookahead rule is then exact given the path's later slots; the
later slots along another draft would differ). A rule that reads them where the
caller passed none is refused (``EvolveError`` naming ``lookahead``), never fed zeros.
Pair-independent: the n-gram simulation and paired comparison
(``evolve.freerun.simulate``, ``evolve.freerun.paired``) and the Hugging Face decoder
(``evolve.data.sources.hf.decode``) all use these functions.
"""

from __future__ import annotations

import inspect

import numpy as np

from evolve.data.decode import (RESIDUAL_EPS, STANDARD, WITHOUT_DRAFT, clipped,
                                entropy, judges_every_draft, lookahead_features, residual,
                                residual_kind, slot_columns, slot_features, top_candidates)
from evolve.errors import EvolveError
from evolve.data import inputs
from evolve.lang.features import ALL_INPUT_NAMES, LOOKAHEAD_INPUT_NAMES, reads_any


def vocab_features(p: np.ndarray, q: np.ndarray, positions, block_positions,
                   lookahead: dict | None = None, classes=None) -> dict:
    """The (M, V) rule features of every token of the vocabulary at M slots.
    ``lookahead``: the slots' lookahead inputs (``next_tv`` and ``ahead``, (M,) each,
    ``evolve.data.decode.lookahead_features`` of their blocks), the same for every
    token of a slot; without it the features have none (``acceptance`` refuses a
    rule that reads them). ``classes``: the vocabulary's token classes (V,)
    (``evolve.data.vocab_class``; without them the features have no ``token_class``)."""
    M, V = p.shape
    look = {}
    if lookahead is not None:
        for f in LOOKAHEAD_INPUT_NAMES:
            v = np.asarray(lookahead[f], dtype=np.float64) if f in lookahead else None
            if v is None or v.shape != (M,):
                got = "missing" if v is None else f"of shape {v.shape}"
                raise EvolveError.of("lookahead", f"{f!r} is {got}; expected one value per "
                                                  f"slot, shape ({M},)")
            look[f] = v

    return inputs.at_slots(inputs.Slots(p, q, None, np.asarray(positions, np.int64),
                                        np.asarray(block_positions, np.int64),
                                        lookahead=look if lookahead is not None else None,
                                        classes=None if classes is None
                                        else np.asarray(classes, dtype=np.float64)))


def trace_lookahead(ts, rows) -> dict | None:
    """The lookahead inputs of rows of a trace split (``evolve.data.traces.TraceSplit``)
    along its recorded drafts, as the offline objectives hold them; None where the
    split has no slot features."""
    slots = slot_columns(ts.columns)
    if slots is None:
        return None
    look = lookahead_features(slots["slot_tv"], int(ts.meta["block_size"]))
    return {f: v[rows] for f, v in look.items()}


def reads_lookahead(rule) -> bool:
    """Whether a rule reads a lookahead input: a tree that has one as a leaf, a scalar
    rule that names one (``evolve.rules.adapters``). Other numpy rules show it by
    asking for one (``acceptance`` catches that)."""
    nodes = getattr(rule, "nodes", None)
    if nodes is not None:
        return reads_any(nodes, LOOKAHEAD_INPUT_NAMES)
    fn = getattr(rule, "fn", None)
    try:
        names = set(inspect.signature(fn).parameters) if callable(fn) else set()
    except (TypeError, ValueError):
        names = set()
    return bool(names & set(LOOKAHEAD_INPUT_NAMES))


def _no_lookahead(rule) -> EvolveError:
    return EvolveError.of("lookahead", f"None (not given), but the rule "
                          f"{getattr(rule, 'name', 'rule')!r} reads "
                          f"{'/'.join(LOOKAHEAD_INPUT_NAMES)}, the later slots of each "
                          "slot's block; expected them per slot "
                          "(evolve.data.decode.lookahead_features of the blocks' slot TVs)")


def acceptance(p: np.ndarray, q: np.ndarray, F: dict, rule, k: int) -> np.ndarray:
    """a(x) for every token: the rule (a ``many(features)`` rule of
    ``evolve.rules.adapters``) on the draft's top-k, the standard rule elsewhere.
    ``EvolveError`` (naming ``lookahead``) for a rule that reads a lookahead input
    that ``F`` lacks."""
    M, V = p.shape
    if any(f not in F for f in LOOKAHEAD_INPUT_NAMES) and reads_lookahead(rule):
        raise _no_lookahead(rule)
    every = judges_every_draft(rule)          # an engine's knob: every token by the rule
    top = None if every else top_candidates(q, k)
    # the rule is element-wise: judged on the top-k only, its thresholds there are the
    # same as judged on the whole vocabulary (and a large tree costs V / k times less)
    cols = {f: F[f] if every else np.take_along_axis(F[f], top, axis=1)
            for f in ALL_INPUT_NAMES if f in F}
    try:
        h = rule.many({f: v.reshape(-1) for f, v in cols.items()})
    except KeyError as e:
        if e.args and e.args[0] in LOOKAHEAD_INPUT_NAMES and e.args[0] not in F:
            raise _no_lookahead(rule) from None
        raise
    if every:
        return clipped(h).reshape(M, V)
    a = np.minimum(1.0, p / q)
    np.put_along_axis(a, top, clipped(h).reshape(M, top.shape[1]), axis=1)
    return a


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


def slot_distortion(p, q, positions, block_positions, rule, k: int,
                    lookahead: dict | None = None, classes=None):
    """(TV, KL) of the emitted token at M slots under ``rule`` (``lookahead`` and
    ``classes``: as for ``vocab_features``)."""
    F = vocab_features(p, q, positions, block_positions, lookahead, classes)
    return distortion(p, exact_output(p, q, acceptance(p, q, F, rule, k), residual_kind(rule)))
