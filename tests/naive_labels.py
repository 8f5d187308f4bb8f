"""The label miner as it was first written (``evolve.data.labels`` before reuse,
memory-sized batches and ended-row dropping): every labelled row's two continuations
computed in full, batch by batch, each history read whole through the target's
``probs`` at every step. The uniforms of a batch of ``batch`` labelled rows starting at s are
``default_rng((seed, s))``, max_new + 1 a row: the definition ``labels.row_uniforms``
keeps with ``UNIFORM_ROWS`` = 2048. The miner is tested to give these labels bit for
bit, under every batch size, split and resume."""

from __future__ import annotations

import numpy as np

from evolve.data.decode import sample_rows
from evolve.data.labels import UNLABELED, could_reject


def continue_text(pair, hist, greedy, uniforms, done_of, max_new, pad=0, keep=None):
    C = pair.context_len
    B, L = hist.shape
    limit = np.broadcast_to(np.asarray(max_new, dtype=np.int64), (B,))
    texts = []
    for i, h in enumerate(hist):
        first = np.flatnonzero(h != pad)
        start = first[0] if first.size else L
        if keep is not None:
            start = max(start, L - int(keep[i]))
        texts.append(h[start:].tolist())
    done = np.array([bool(done_of(t)) for t in texts], dtype=bool) | (limit <= 0)
    steps = int(limit.max(initial=0))
    passes = calls = 0
    for step in range(steps):
        live = np.flatnonzero(~done)
        if live.size == 0:
            break
        P = pair.target.probs(hist[live, -C:])
        passes += live.size
        calls += 1
        nxt = (np.argmax(P, axis=1) if greedy else sample_rows(P, uniforms[live, step]))
        hist = np.concatenate([hist, np.full((B, 1), pad, dtype=hist.dtype)], axis=1)
        hist[live, -1] = nxt
        for i, b in zip(live, nxt):
            texts[i].append(int(b))
            if step + 1 >= limit[i] or done_of(texts[i]):
                done[i] = True
    return texts, passes, calls


def mine(pair, cols, answer_of, done_of, greedy, max_new, seed=0, pad=0, batch=2048,
         max_tokens=None):
    """(labels, target rows read, target calls, each labelled row's (sub, own) texts) as
    the first miner computed them."""
    rows = np.flatnonzero(could_reject(cols, greedy))
    labels = np.full(len(cols["token"]), UNLABELED, dtype=np.int8)
    passes = calls = 0
    texts = []
    for s in range(0, rows.size, batch):
        r = rows[s:s + batch]
        ctx = np.asarray(cols["context"][r])
        u = np.random.default_rng((seed, s)).random((r.size, max_new + 1))
        limit = max_new
        if max_tokens is not None:
            limit = np.minimum(max_new, max_tokens - 1 - np.asarray(cols["position"])[r])
        sub = np.concatenate([ctx, np.asarray(cols["token"][r], ctx.dtype)[:, None]], axis=1)
        if greedy:
            own = np.concatenate([ctx, np.asarray(cols["target_top"][r], ctx.dtype)[:, None]],
                                 axis=1)
        else:
            P = pair.target.probs(ctx[:, -pair.context_len:])
            passes += r.size
            calls += 1
            own = np.concatenate([ctx, sample_rows(P, u[:, 0]).astype(ctx.dtype)[:, None]],
                                 axis=1)
        keep = np.asarray(cols["position"])[r] + 1
        a, pa, ca = continue_text(pair, sub, greedy, u[:, 1:], done_of, limit, pad, keep)
        b, pb, cb = continue_text(pair, own, greedy, u[:, 1:], done_of, limit, pad, keep)
        passes += pa + pb
        calls += ca + cb
        labels[r] = [int(answer_of(x) != answer_of(y)) for x, y in zip(a, b)]
        texts += list(zip(a, b))
    return labels, passes, calls, texts
