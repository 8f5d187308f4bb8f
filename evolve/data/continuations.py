"""Continuing histories with a pair's target, batched: what label mining computes.

``continue_text`` continues a batch of histories one token a step (the target's argmax,
or the inverse-CDF draw with given uniforms) until each text ends or reaches its budget;
each step reads the target once for the rows that have not ended. A pair with a
``continuation_reader`` (a Hugging Face one) reads from its KV cache and chooses the
token on its device; any other pair's target gives probabilities on the host
(``_host_next``).
"""

from __future__ import annotations

import numpy as np

from evolve.data.decode import sample_rows


def text_of(hist_row: np.ndarray, pad, keep: int | None) -> list:
    """The generated text of one history: its tokens after the leading ``pad`` ones,
    and with ``keep`` no more than its last ``keep`` tokens (the prompt is not text)."""
    L = hist_row.shape[0]
    first = np.flatnonzero(hist_row != pad)
    start = first[0] if first.size else L
    if keep is not None:
        start = max(start, L - int(keep))
    return hist_row[start:].tolist()


def _host_next(pair, greedy: bool):
    """How a pair without a ``continuation_reader`` gives the next tokens: its target's
    probabilities of each live row's last ``context_len`` tokens, then the argmax or
    the inverse-CDF draw (``sample_rows``) on the host."""
    C = pair.context_len

    def next_tokens(live, h, u):
        P = pair.target.probs(h[live, -C:])
        return np.argmax(P, axis=1) if greedy else sample_rows(P, u)
    return next_tokens


def continue_text(pair, hist: np.ndarray, greedy: bool, uniforms, done_of, max_new,
                  pad: int = 0, keep=None) -> tuple[list, int, int]:
    """The texts after continuing every history (B, L) with the target until
    ``done_of(text)`` or ``max_new`` more tokens (a number, or one per row; greedy:
    argmax; else inverse-CDF with ``uniforms`` (B, max)); leading ``pad`` tokens are
    not text, nor, with ``keep`` (one number per row), any but the last ``keep``
    tokens of a history (the prompt). A text is a list of token ids (byte values for
    a byte-level pair). Each step reads the target for the rows that have not ended
    (an ended row is never read again): the last ``context_len`` tokens of each
    history, or, for a pair with a ``continuation_reader`` (a Hugging Face one: its
    KV cache, the next token chosen on its device), as that reader reads them.
    Returns the texts, the target rows read (rows x positions) and the target's
    forward passes (one batched call a position)."""
    B, L = hist.shape
    limit = np.broadcast_to(np.asarray(max_new, dtype=np.int64), (B,))
    texts = [text_of(h, pad, None if keep is None else keep[i]) for i, h in enumerate(hist)]
    done = np.array([bool(done_of(t)) for t in texts], dtype=bool) | (limit <= 0)
    steps = int(limit.max(initial=0))
    buf = np.full((B, L + steps), pad, dtype=hist.dtype)
    buf[:, :L] = hist
    reader = getattr(pair, "continuation_reader", None)
    next_tokens = (reader(hist, steps, greedy) if reader is not None
                   else _host_next(pair, greedy))
    passes = calls = 0
    for step in range(steps):
        live = np.flatnonzero(~done)
        if live.size == 0:
            break
        nxt = next_tokens(live, buf[:, :L + step],
                          None if greedy else uniforms[live, step])
        passes += live.size
        calls += 1
        buf[live, L + step] = nxt
        for i, b in zip(live, nxt):
            texts[i].append(int(b))
            if step + 1 >= limit[i] or done_of(texts[i]):
                done[i] = True
    return texts, passes, calls
