"""The emitted token's distribution at a slot under a rule that reads the lookahead
inputs, estimated over the block's later drafts (the n-gram pair's models here; a
Hugging Face pair's are read through ``evolve.data.sources.hf.lookahead``).

``next_tv`` and ``ahead`` at slot i are computed from the slot TVs of the block's later
slots, and slot m's TV depends on the drafts before it. So a lookahead rule's decision
at slot i depends on drafts after i, and two things change at slot j:

- the acceptance of a candidate y at j depends on the drafts that would follow y;
- reaching j (every earlier slot accepted) depends on x_j and later drafts too, which
  tilts the drafted token at j away from q.

Given the block's prefix (its start context and the drafts x_0 .. x_(j-1)) and that j
is reached, with F = (x_j, ..., x_(g-2)) the drafts that the lookahead inputs of slots
<= j read, w(F) = prod over i < j of a_i(F) the probability the earlier slots accept
(their uniforms are independent of F) and a_j(F) the acceptance of x_j:

    e(y) = [q(y) E[w a_j | x_j = y] + r(y) sum_y' q(y') E[w (1 - a_j) | x_j = y']]
           / sum_y' q(y') E[w | x_j = y']

with r the standard residual at j. Every candidate y is enumerated; the drafts after y
that slots <= j read (x_(j+1) .. x_(g-2)) are sampled from the draft, ``futures`` per y
(none are needed at the last two slots: there e is exact). The ratio is a consistent
estimate, not an unbiased one: its bias shrinks as 1/futures (``estimate_slots``
returns the same slots at half the futures too, so a caller can report the
difference). For a rule that reads no lookahead input w and a_j do not depend on F and
e is the exact emission of ``evolve.data.emission`` (tested to rounding).
"""

from __future__ import annotations

import numpy as np

from evolve.data import decode as DEC
from evolve.data import inputs
from evolve.data import emission as EM
from evolve.data import vocab_class as VC

VOCAB = DEC.VOCAB


def _acceptance(rule, p, q, position, block_position, tokens, look: dict,
                k: int, classes=None) -> np.ndarray:
    """a of ``tokens`` (N,) at one slot whose distributions are p, q (V,), at
    ``position`` and ``block_position``, with lookahead values ``look`` (N,) per token:
    the rule's clipped threshold for drafts among q's top k, the standard rule for the
    others (as the decoders apply it). The slot's own inputs are computed once, on its
    one row, and broadcast: the same values as on N repeated rows."""
    F = {n: v[0] for n, v in inputs.at_slots(inputs.Slots(
        p[None], q[None], tokens[None], np.array([position]), np.array([block_position]),
        lookahead={n: v[None] for n, v in look.items()},
        classes=None if classes is None else np.asarray(classes, np.float64))).items()}
    a = DEC.clipped(rule.many(F))
    if DEC.judges_every_draft(rule):
        return a
    inside = np.isin(tokens, DEC.top_candidates(q[None], k)[0])
    return np.where(inside, a, np.minimum(1.0, p[tokens] / q[tokens]))


def block_dists(pair, block: dict):
    """(P, Q), (g, V): the target's and the draft's distributions at each slot of a
    block (after its recorded contexts)."""
    H = np.asarray(block["context"], dtype=np.uint8)
    return pair.target.probs(H), pair.draft.probs(H)


def context_probs(pair, context: np.ndarray):
    """The n-gram pair's ``after(appended)``: p, q (N, V) after ``context`` (the block's
    C tokens before the slot) followed by each row of ``appended`` (N, d)."""
    C = pair.context_len
    context = np.asarray(context, dtype=np.uint8)

    def after(appended: np.ndarray):
        H = np.concatenate([np.tile(context, (appended.shape[0], 1)),
                            appended.astype(np.uint8)], axis=1)[:, -C:]
        return pair.target.probs(H), pair.draft.probs(H)
    return after


def slot_emission(pair, rule, block: dict, j: int, futures: int, rng,
                  dists=None, after=None, candidates: int | None = None,
                  info: dict | None = None) -> np.ndarray:
    """The estimated emitted distribution (V,) at slot ``j`` of one block.

    ``block``: the block's recorded columns (g rows each): ``context`` (C tokens before
    each slot), ``token``, ``position``, ``block_position``, ``slot_tv`` (the path's
    slot TVs; slot i's depends only on the drafts before i). ``dists``: the block's
    ``block_dists`` when the caller has them. ``after(appended)``: the target's and
    the draft's distributions (N, V) after the history before slot j followed by each
    row of ``appended`` (N, d): for a pair whose models read the whole history (the
    Hugging Face pair: ``evolve.data.sources.hf.lookahead``); by default the n-gram
    pair's after ``block["context"][j]`` (``context_probs``).

    ``candidates``: the later drafts are sampled after only the draft's most likely
    ``candidates`` tokens at slot j (all by default: exact in the candidates); the
    others' lookahead inputs are those of the most likely one's futures. Whatever the
    others' acceptance, the emitted distribution moves by at most 1.5 tau / Z in TV
    (tau: the draft's mass outside the candidates, Z: the chance the slot's drafts are
    reached); ``info`` gets ``tail`` (tau) and ``bound`` (that TV bound)."""
    g = pair.config.block_size
    k = pair.config.top_k
    if after is None:
        after = context_probs(pair, block["context"][j])
    PB, QB = block_dists(pair, block) if dists is None else dists
    p, q = PB[j], QB[j]
    V = p.size
    ids = np.uint8 if V <= 256 else np.int64   # the tokens' type
    depth = max(0, g - 2 - j)             # drafts after x_j that slots <= j read
    M = futures if depth >= 1 else 1      # none to sample at the last two slots: exact
    if candidates is None or candidates >= V or j == g - 1:    # (no later slot to read)
        head = np.arange(V)
    else:                                 # the most likely first, ties by token
        head = np.sort(np.argsort(-q, kind="stable")[:candidates])
    ys = np.repeat(head, M)               # (H M,): candidate y, each with M futures
    app = ys[:, None].astype(ids)         # the tokens after the prefix, per row
    tv = np.tile(np.asarray(block["slot_tv"], dtype=np.float64)[:j + 1], (ys.size, 1))
    later = []
    for m in range(j + 1, g):             # slot m's TV, after x_(m-1)
        # each distinct continuation once (all share the block's prefix: the drafts
        # after it tell them apart; H at m = j + 1, few more later where the draft is sure)
        _, first, inv = np.unique(app, axis=0, return_index=True, return_inverse=True)
        P, Q = (x[inv.reshape(-1)] for x in after(app[first]))
        later.append(np.maximum(Q - P, 0.0).sum(axis=1))
        if m < g - 1:                     # the next draft, for the next slot's context
            x = DEC.sample_rows(Q, rng.random(ys.size))
            app = np.concatenate([app, x[:, None].astype(ids)], axis=1)
        del P, Q
    tv = np.concatenate([tv] + [t[:, None] for t in later], axis=1) if later else tv
    if tv.shape[1] < g:                   # j = g - 1: no later slots
        tv = np.concatenate([tv, np.zeros((ys.size, g - tv.shape[1]))], axis=1)
    if head.size < V:                     # the others: the most likely one's futures
        at = np.full(V, int(np.argmax(q[head])))
        at[head] = np.arange(head.size)
        tv = tv[(at[:, None] * M + np.arange(M)).reshape(-1)]
        ys = np.repeat(np.arange(V), M)
    look = DEC.lookahead_features(tv.reshape(-1), g)
    look = {f: v.reshape(ys.size, g) for f, v in look.items()}
    # the earlier slots' acceptances of the path's drafts, under each future
    w = np.ones(ys.size)
    for i in range(j):
        tok = np.full(ys.size, int(block["token"][i]))
        w *= _acceptance(rule, PB[i], QB[i], block["position"][i], i, tok,
                         {f: v[:, i] for f, v in look.items()}, k, VC.of_pair(pair))
    a = _acceptance(rule, p, q, block["position"][j], j, ys,
                    {f: v[:, j] for f, v in look.items()}, k, VC.of_pair(pair))
    A = (w * a).reshape(V, M).mean(axis=1)               # E[w a_j | y]
    W = w.reshape(V, M).mean(axis=1)                     # E[w | y]
    R = (w * (1.0 - a)).reshape(V, M).mean(axis=1)       # E[w (1 - a_j) | y]
    r = DEC.residual(p[None], q[None])[0]
    r = r / r.sum()
    Z = float((q * W).sum())
    if info is not None:
        tail = float(max(0.0, 1.0 - q[head].sum() / q.sum())) if head.size < V else 0.0
        info.update(tail=tail, bound=1.5 * tail / Z if Z > 0.0 else float("nan"))
    if Z <= 0.0:                          # the slot cannot be reached: nothing emitted
        return np.full(V, np.nan)
    return (q * A + r * float((q * R).sum())) / Z


def estimate_slots(pair, rule, cols: dict, rows: np.ndarray, futures: int, seed: int):
    """(TV, KL) of the estimated emission at the drafted positions ``rows`` of a
    decoder's columns (``evolve.data.decode.decode``, rows in block order), and the
    same at half the futures (from an independent stream): (tv, kl, tv_half)."""
    g = pair.config.block_size
    tv, kl, tv_half = (np.empty(rows.size) for _ in range(3))
    names = ("context", "token", "position", "block_position", "slot_tv")
    for n, row in enumerate(rows):
        start = int(row) - int(cols["block_position"][row])
        block = {f: cols[f][start:start + g] for f in names}
        j = int(cols["block_position"][row])
        dists = block_dists(pair, block)
        p = dists[0][j:j + 1]
        for out, m, stream in ((None, futures, 0), (tv_half, max(1, futures // 2), 1)):
            rng = np.random.default_rng((seed, int(row), stream))
            e = slot_emission(pair, rule, block, j, m, rng, dists)
            t, k_ = EM.distortion(p, e[None])
            if out is None:
                tv[n], kl[n] = t[0], k_[0]
            else:
                out[n] = t[0]
    return tv, kl, tv_half


def sample_slots(reached: int, slots: int, seed: int) -> np.ndarray:
    """Which of ``reached`` slots (in decoding order) the estimate is made at: at most
    ``slots`` of them drawn at random for the comparison's ``seed``, sorted."""
    rng = np.random.default_rng((seed, 11))
    return np.sort(rng.choice(reached, size=min(reached, slots), replace=False))


def estimate_note(reached: int, futures: int, tv: np.ndarray,
                  tv_half: np.ndarray) -> tuple[dict, np.ndarray]:
    """What a comparison says of an estimated distortion (``distortion``), and each
    estimated slot's weight in the per-sequence sums (1 / its sampling probability)."""
    note = {"kind": "estimate", "slots": int(tv.size), "reached": int(reached),
            "futures": futures, "slot_tv_mean": float(tv.mean()) if tv.size else 0.0,
            "slot_tv_mean_half_futures": float(tv_half.mean()) if tv.size else 0.0,
            "why": "the rule reads the lookahead inputs: its emitted distribution at a "
                   "slot depends on the drafts after it, estimated over sampled later "
                   "drafts at a random sample of the reached slots"}
    return note, np.full(tv.size, reached / max(tv.size, 1))
