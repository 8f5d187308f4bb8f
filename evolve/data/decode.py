"""The speculative decoder: draft a block, verify it, keep the accepted prefix.

One block, block size ``g``, exactly as real speculative decoding: the draft
samples ``x_1 .. x_g`` autoregressively from ``q``; the target scores the
``g + 1`` contexts; position ``j`` is accepted iff ``u_j < a_j(x_j)`` (the
standard rule ``min(1, p_j(x_j) / q_j(x_j))`` unless a rule is given); the
longest accepted prefix is kept, then one more token is drawn from
``norm(max(0, p - q))`` at the first rejection, or from ``p_{g+1}`` (the bonus
token) when all ``g`` were accepted. A rule whose ``residual`` is
``target_without_draft`` (SGLang's target-only verification) judges every
draft and draws after a rejection of ``x`` from p with x removed
(``rejection_residual``). Every drafted position is recorded, also
those after the first rejection (another rule might have reached them).

A pair is any object with ``target`` and ``draft`` models (``probs(H)``: next-
token distributions for a batch of histories) and a ``config`` with
``block_size``, ``top_k`` and ``context_len``: the n-gram pair of
``evolve.data.sources.ngram``, the task pair. A pair over another vocabulary than
the bytes says so with ``vocab`` (its size) and ``token_dtype`` (of the recorded
token ids); the histories keep the prompts' dtype (the Hugging Face task pair:
int32, left-padded with -1).
"""

from __future__ import annotations

import numpy as np

from evolve.data import vocab_class as VC
# the elementary functions of the inputs, defined once with them (and read from here too)
from evolve.data.inputs import (KL_FLOOR, Slots, at_slots, entropy,  # noqa: F401
                                lookahead_features, ranks, slot_columns, slot_features,
                                slots_missing)

VOCAB = 256        # the byte vocabulary of the n-gram pair (evolve.data.sources.ngram_lm)


def sample_rows(P: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw of one index per row of a non-negative matrix (need not sum to 1)."""
    cdf = np.cumsum(P, axis=1)
    x = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1)
    last = P.shape[1] - 1 - np.argmax(P[:, ::-1] > 0, axis=1)
    return np.minimum(x, last)


RESIDUAL_EPS = 1e-12     # the one definition: objectives, kernels and exports import it


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Unnormalised residual max(0, p - q); rows of mass < RESIDUAL_EPS fall back to p.

    (Those rows have p == q up to rounding; any rejection there resamples from p.)
    """
    r = np.maximum(p - q, 0.0)
    small = r.sum(axis=1) < RESIDUAL_EPS
    if small.any():
        r[small] = p[small]
    return r


STANDARD = "standard"                    # residual kinds of a rule (evolve.rules.table)
WITHOUT_DRAFT = "target_without_draft"


def residual_kind(rule) -> str:
    """What a rule emits after a rejection: ``rule.residual`` (rules of the rules
    table carry it, ``evolve.rules.adapters.named_rule``), else the standard residual."""
    kind = getattr(rule, "residual", STANDARD) if rule is not None else STANDARD
    if kind not in (STANDARD, WITHOUT_DRAFT):
        raise ValueError(f"rule {getattr(rule, 'name', rule)!r}: unknown residual {kind!r}")
    return kind


def judges_every_draft(rule) -> bool:
    """Whether the rule judges every draft (an engine's knob, ``rule.scope`` =
    "vocabulary", or a target-only rule) rather than only the draft's top-k."""
    return (residual_kind(rule) != STANDARD
            or (rule is not None and getattr(rule, "scope", "top_k") == "vocabulary"))


def rejection_residual(kind: str, p: np.ndarray, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The unnormalised distribution of the token emitted after a rejection of the
    drafts ``x`` (one per row): ``residual(p, q)`` for the standard kind; for
    ``WITHOUT_DRAFT`` (SGLang's target-only verification) p with x removed,
    p 1[y != x], or p itself where that has mass < RESIDUAL_EPS (p(x) = 1)."""
    if kind == STANDARD:
        return residual(p, q)
    r = p.copy()
    r[np.arange(r.shape[0]), np.asarray(x, dtype=np.int64)] = 0.0
    small = r.sum(axis=1) < RESIDUAL_EPS
    if small.any():
        r[small] = p[small]
    return r


SORT_ALL_MAX_VOCAB = 4096   # above this, candidates come from a partial sort


def top_candidates(q: np.ndarray, k: int) -> np.ndarray:
    """Column ids of the k largest entries of each row of q, q descending, lower id first
    on ties. Large vocabularies use a partial sort; there, which of several ids tied
    at the k-th value is kept is deterministic but not necessarily the lowest."""
    V = q.shape[1]
    if V <= SORT_ALL_MAX_VOCAB or k >= V:
        return np.argsort(-q, axis=1, kind="stable")[:, :k]
    part = np.argpartition(-q, k - 1, axis=1)[:, :k]
    o = np.lexsort((part, -np.take_along_axis(q, part, axis=1)), axis=-1)
    return np.take_along_axis(part, o, axis=1)


def candidate_summary(p: np.ndarray, q: np.ndarray, k: int, token_dtype=np.uint8) -> dict:
    """Top-k candidates of q (stable: lower id first on ties) and the tail masses.

    ``token_dtype``: uint8 for byte-level pairs (schema v2 as first written), a wider
    integer type for larger vocabularies."""
    B, V = q.shape
    order = top_candidates(q, k)
    in_top = np.zeros((B, V), dtype=bool)
    np.put_along_axis(in_top, order, True, axis=1)
    tail = ~in_top
    plus = tail & (p > q)
    cp = np.take_along_axis(p, order, axis=1)
    return {
        "cand_token": order.astype(token_dtype),
        "cand_draft_prob": np.take_along_axis(q, order, axis=1),
        "cand_target_prob": cp,
        "tail_draft_prob": np.where(tail, q, 0.0).sum(axis=1),
        "tail_target_prob": np.where(tail, p, 0.0).sum(axis=1),
        "tail_excess_draft_prob": np.where(plus, q, 0.0).sum(axis=1),
        "tail_excess_target_prob": np.where(plus, p, 0.0).sum(axis=1),
    }


# --------------------------------------------------------------- decoding

BATCH = 256      # prompts decoded together (results do not depend on it)


def decode(pair, prompts: np.ndarray, rngs, blocks: int, batch: int = BATCH,
           rule=None, record: bool = True, pos0=None, history: bool = False,
           greedy: bool = False, end: int | None = None, tick=None,
           max_tokens: int | None = None, done_of=None):
    """Speculative decoding of every prompt for ``blocks`` blocks.

    ``rule=None`` is the standard rule (the trace generator); otherwise ``rule``
    has a ``many(features) -> thresholds`` method (``evolve.rules.adapters``) and
    is applied to drafts among the draft's top-k bytes, the standard rule to the
    others (an engine's knob, ``judges_every_draft``, to every draft, with its
    own residual). ``pos0`` (per prompt) offsets the ``position`` feature.

    ``greedy``: greedy speculative decoding. The draft proposes its argmax at each
    position; the standard rule keeps a draft iff it is the target's argmax, and the
    token after the accepted prefix is the target's argmax there. A rule decides the
    drafts that are not the target's argmax (a mismatch is kept iff u < its clipped
    threshold, as in the seed); matches are always kept. Only rules with the standard
    residual decode greedily (ValueError otherwise). The records keep the schema's
    ``baseline_accepts`` (rand_value < min(1, p/q)); the greedy standard decision is
    ``token == target_top``.

    ``end``: a token that ends a sequence (a task's answer). A sequence stops once a
    block has emitted it, and decoding stops when every sequence has (at most
    ``blocks`` blocks). The records then hold the column ``live`` (the row's block
    began before its sequence ended), and blocks after the end count -1 accepted.
    ``max_tokens``: a sequence also ends once it has generated that many tokens
    (the last block may pass it by up to g tokens), with the same records.
    ``done_of``: a sequence also ends once ``done_of(its generated tokens)`` holds after
    a block (a task's stop strings).

    Returns ``(columns, accepted)``: the v1 + v2 + v3 columns of every drafted
    position (rows ordered by sequence, block, position; None unless ``record``)
    and the accepted draft count of every block, int64 (n, blocks); with
    ``history`` also the decoded text (n, prompt + blocks (g + 1)), in the prompts'
    dtype, and each row's length, as a third and fourth value. ``tick()``, when
    given, is called after each batch of ``batch`` prompts.
    """
    cfg = pair.config
    g, k, C = cfg.block_size, cfg.top_k, cfg.context_len
    n = prompts.shape[0]
    if prompts.shape[1] < C:
        raise ValueError(f"prompts have {prompts.shape[1]} bytes, the models need {C}")
    # All uniforms of a prompt are drawn up front: draft (blocks, g), accept (blocks, g),
    # resample/bonus (blocks,), so results do not depend on ``batch``.
    U = (np.stack([r.random((blocks, 2 * g + 1)) for r in rngs]) if n
         else np.zeros((0, blocks, 2 * g + 1)))
    pos0 = np.zeros(n, dtype=np.int64) if pos0 is None else np.asarray(pos0, dtype=np.int64)
    if greedy and residual_kind(rule) != STANDARD:
        raise ValueError(f"rule {getattr(rule, 'name', rule)!r}: greedy decoding takes rules "
                         "with the standard residual (the correction is the target's argmax)")
    parts, accepted, hists, lengths = [], [], [], []
    for s0 in range(0, n, batch):
        cols, n_acc, hist, lens = _decode_batch(pair, prompts[s0:s0 + batch], U[s0:s0 + batch],
                                                blocks, g, k, C, s0, rule, record,
                                                pos0[s0:s0 + batch], greedy, end,
                                                max_tokens, done_of)
        parts.append(cols)
        accepted.append(n_acc)
        if history:
            hists.append(hist)
            lengths.append(lens)
        if tick is not None:
            tick()
    cols = ({f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
            if record and parts else None)
    acc = np.concatenate(accepted) if accepted else np.zeros((0, blocks), dtype=np.int64)
    if history:
        return cols, acc, np.concatenate(hists), np.concatenate(lengths)
    return cols, acc


def batch_ticks(n: int, batch: int, advance):
    """A decoder's ``tick()`` (``decode``'s, the Hugging Face recorder's), called after
    each batch of ``batch`` of ``n`` prompts, as ``advance(the batch's size)``; None
    without ``advance``."""
    if advance is None:
        return None
    done = [0]

    def tick():
        step = min(batch, n - done[0])
        done[0] += step
        advance(step)
    return tick


def _decode_batch(pair, prompts, U, blocks, g, k, C, seq0, rule, record, pos0, greedy=False,
                  end=None, max_tokens=None, done_of=None):
    B = prompts.shape[0]
    L0 = prompts.shape[1]
    V = getattr(pair, "vocab", VOCAB)
    tdt = getattr(pair, "token_dtype", np.uint8)
    stops = end is not None or max_tokens is not None or done_of is not None
    hist = np.zeros((B, L0 + blocks * (g + 1)), dtype=prompts.dtype)
    hist[:, :L0] = prompts
    lens = np.full(B, L0, dtype=np.int64)
    rows = np.arange(B)
    classes = None if rule is None else VC.of_pair(pair)
    rec: dict[str, list] = {}
    accepted = np.zeros((B, blocks), dtype=np.int64)
    done = np.zeros(B, dtype=bool)             # the sequence has emitted ``end``
    mism = np.zeros(B)                         # accepted mismatches so far
    ran = 0

    def put(name, arr):
        rec.setdefault(name, []).append(arr)

    for t in range(blocks):
        if stops and done.all():
            accepted[:, t:] = -1
            break
        ran = t + 1
        live = ~done
        gen_before = lens - L0 + pos0
        ext = np.zeros((B, C + g), dtype=hist.dtype)
        ext[:, :C] = hist[rows[:, None], lens[:, None] - C + np.arange(C)[None, :]]
        Q = np.empty((B, g, V))
        for j in range(g):
            Q[:, j] = pair.draft.probs(ext[:, j:j + C])
            ext[:, C + j] = (np.argmax(Q[:, j], axis=1) if greedy
                             else sample_rows(Q[:, j], U[:, t, j]))
        ctxs = np.stack([ext[:, j:j + C] for j in range(g + 1)], axis=1)      # (B, g+1, C)
        P = pair.target.probs(ctxs.reshape(B * (g + 1), C)).reshape(B, g + 1, V)
        X = ext[:, C:].astype(np.int64)                                       # (B, g)
        qx = np.take_along_axis(Q, X[:, :, None], axis=2)[:, :, 0]
        px = np.take_along_axis(P[:, :g], X[:, :, None], axis=2)[:, :, 0]
        rand = U[:, t, g:2 * g]
        Pg = P[:, :g].reshape(B * g, V)
        Qg = Q.reshape(B * g, V)
        if record or rule is not None:
            cs = candidate_summary(Pg, Qg, k, tdt)
        if getattr(rule, "decides_blocks", False):     # a rule that reads the texts
            a_x = rule.block_acceptance(pair, ctxs[:, :g], X, P[:, :g], Q, gen_before, greedy)
        elif greedy:      # matches kept, a rule judges the mismatches
            match = X == np.argmax(P[:, :g], axis=2)
            a_x = (match.astype(np.float64) if rule is None else np.where(
                match, 1.0, drafted_acceptance(rule, Pg, Qg, X, qx, px, gen_before, cs,
                                               mism, classes)))
        else:
            a_x = (np.minimum(1.0, px / qx) if rule is None
                   else drafted_acceptance(rule, Pg, Qg, X, qx, px, gen_before, cs, mism,
                                           classes))
        acc = rand < a_x
        n_acc = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
        took = np.arange(g)[None, :] < n_acc[:, None]
        mism = mism + (took & (X != np.argmax(P[:, :g], axis=2))).sum(axis=1)
        accepted[:, t] = n_acc
        # the byte after the accepted prefix: residual at the first rejection, else bonus
        Pn = P[rows, n_acc]
        if greedy:      # the target's argmax (at a rejection and after the last draft)
            new = np.argmax(Pn, axis=1)
        else:
            Qn = np.where((n_acc < g)[:, None], Q[rows, np.minimum(n_acc, g - 1)], 0.0)
            Rn = rejection_residual(residual_kind(rule), Pn, Qn,
                                    X[rows, np.minimum(n_acc, g - 1)])
            new = sample_rows(np.where((n_acc < g)[:, None], Rn, Pn), U[:, t, 2 * g])
        out = np.concatenate([X, new[:, None]], axis=1)
        out[rows, n_acc] = new
        emit = j_upto(n_acc, g) & live[:, None]      # an ended sequence emits nothing
        for j in range(g + 1):
            m = emit[:, j]
            hist[m, lens[m] + j] = out[m, j]
        if stops:       # an ended sequence keeps its text; its blocks count -1
            accepted[:, t] = np.where(live, n_acc, -1)
            lens = lens + np.where(live, n_acc + 1, 0)
            if end is not None:
                done = done | (live & ((out == end) & emit).any(axis=1))
            if max_tokens is not None:
                done = done | (lens - L0 >= max_tokens)
            if done_of is not None:
                for i in np.flatnonzero(live & ~done):
                    done[i] = bool(done_of(hist[i, L0:lens[i]].tolist()))
        else:
            lens = lens + n_acc + 1
        if not record:
            continue
        # records for the g drafted positions (the schema's standard decisions)
        schema_acc = rand < np.minimum(1.0, px / qx) if greedy else acc
        for f, v in block_records(Pg, Qg, X, qx, px, rand, schema_acc, cs, gen_before,
                                  seq0 + rows, t).items():
            put(f, v)
        put("context", ctxs[:, :g].reshape(B * g, C))
        if stops:
            put("live", np.repeat(live, g))
    if not record:
        return None, accepted, hist, lens
    return sequence_major(rec, ran, B, g), accepted, hist, lens


def j_upto(n_acc: np.ndarray, g: int) -> np.ndarray:
    """(B, g + 1): True at the emitted places of a block, 0 .. n_acc."""
    return np.arange(g + 1)[None, :] <= np.asarray(n_acc)[:, None]



def clipped(h) -> np.ndarray:
    """Thresholds as acceptance probabilities: clip(h, 0, 1), NaN to 0. The one
    definition: the decoders, ``emission`` and the offline objectives
    (``evolve.objectives.metrics.clip01``) all use it."""
    h = np.asarray(h, dtype=np.float64)
    return np.where(h > 0.0, np.where(h > 1.0, 1.0, h), 0.0)


def drafted_acceptance(rule, Pg, Qg, X, qx, px, gen_before, cs: dict,
                       mismatches=None, classes=None) -> np.ndarray:
    """Acceptance probabilities (B, g) of a block's drafted tokens under ``rule`` (a
    ``many(features) -> thresholds`` rule): its clipped threshold for drafts among the
    draft's top-k (``cs``, a ``candidate_summary``), the standard rule for the others.
    Both decoders (n-gram and Hugging Face) decide with this. Pg, Qg hold the block's
    rows b g + j, so the lookahead inputs (``lookahead_features`` of the slot TVs) at
    slot j are those of the block's real later slots, along the drafted tokens, as
    verification knows them; ``mismatches`` (B,): each sequence's accepted drafts that
    were not the target's top token before the block; ``classes``: the vocabulary's
    token classes (``evolve.data.vocab_class``)."""
    B, g = X.shape
    x = X.reshape(-1)
    feats = at_slots(Slots(
        Pg, Qg, x, (gen_before[:, None] + np.arange(g)[None, :]).reshape(-1),
        np.tile(np.arange(g), B), g=g,
        history=None if mismatches is None else {"mismatches": np.repeat(mismatches, g)},
        classes=None if classes is None else np.asarray(classes, dtype=np.float64)))
    a = clipped(rule.many(feats))
    if judges_every_draft(rule):             # an engine's knob judges every draft
        return a.reshape(B, g)
    in_top = (cs["cand_token"].astype(np.int64) == x[:, None]).any(axis=1)
    return np.where(in_top, a, np.minimum(1.0, px / qx).reshape(-1)).reshape(B, g)


def block_records(Pg, Qg, X, qx, px, rand, acc, cs: dict, gen_before, seqs, t: int) -> dict:
    """Schema-v3 columns (all but ``context``) of one block of every sequence of a
    batch: Pg, Qg the (B g, V) distributions at the g drafted positions; X, qx, px,
    rand, acc (B, g) the drafts, their probabilities, uniforms and standard-rule
    decisions; cs their ``candidate_summary``; gen_before (B,) the tokens generated
    before the block; seqs (B,) the sequence numbers; t the block number."""
    B, g = X.shape
    x = X.reshape(-1)
    top = np.argmax(Pg, axis=1)
    hit = cs["cand_token"].astype(np.int64) == x[:, None]
    return {"draft_prob": qx.reshape(-1), "target_prob": px.reshape(-1),
            "position": (gen_before[:, None] + np.arange(g)[None, :]).reshape(-1),
            "draft_entropy": entropy(Qg), "target_entropy": entropy(Pg),
            "top_token_match": x == top, "rand_value": rand.reshape(-1),
            "baseline_accepts": acc.reshape(-1), "sequence": np.repeat(seqs, g),
            "block_index": np.full(B * g, t, dtype=np.int64),
            "block_position": np.tile(np.arange(g), B), "token": x,
            "draft_cand": np.where(hit.any(axis=1), np.argmax(hit, axis=1), -1),
            "target_top": top, "p_max": Pg.max(axis=1), "q_max": Qg.max(axis=1), **cs,
            **slot_features(Pg, Qg),
            "target_rank": ranks(Pg, px.reshape(-1)).astype(np.int32),
            "cand_target_rank": ranks(Pg, cs["cand_target_prob"]).astype(np.int32)}


INT_COLUMNS = ("position", "sequence", "block_index", "block_position", "token", "draft_cand",
               "target_top", "slot_n_q_gt_p")
RANK_COLUMNS = ("target_rank", "cand_target_rank")     # int32 (evolve.data.traces.V4_FIELDS)


def sequence_major(rec: dict, blocks: int, B: int, g: int) -> dict:
    """Columns recorded block by block, each a list of (B g, ...) arrays, as rows
    ordered by sequence, block and block position."""
    out = {}
    for f, parts in rec.items():
        a = np.stack(parts)                       # (blocks, B*g, ...)
        a = a.reshape((blocks, B, g) + a.shape[2:]).swapaxes(0, 1)
        out[f] = np.ascontiguousarray(a.reshape((blocks * B * g,) + a.shape[3:]))
    for f in INT_COLUMNS:
        out[f] = out[f].astype(np.int64)
    for f in RANK_COLUMNS:
        if f in out:
            out[f] = out[f].astype(np.int32)
    return out
