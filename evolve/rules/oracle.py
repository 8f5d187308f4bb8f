"""The answer oracle: the headroom any judge has on a task.

A per-token judge (AutoJudge, a KL judge, an evolved rule, a lenient family) keeps a
draft the lossless rule would reject when it deems the draft harmless. The oracle knows
which are: decoding free-running, at every draft of a block that the lossless rule
could reject (greedy: not the target's top token; sampling: p < q), it continues the
text with the target from the draft and from the lossless alternative (greedy: the
target's top token; sampling: the target's own draw at the row, then the same uniforms
for both, as labels are mined, ``evolve.data.labels``) and keeps the draft exactly when
the two answers are the same. Its other decisions are the lossless rule's. Labels
recorded on the lossless path belong to another text once a rule leaves it, so the
oracle decides on the text it is decoding, at each block.

A draft that keeps the answer can still lengthen it (a wording the target would not
have chosen, which it then finishes at length), and a longer answer takes more target
calls. So the oracle (``no_longer``, the default) keeps a draft when the answer is the
same and the text is not longer; the ``answer oracle`` (``no_longer=False``) keeps every
draft that keeps the answer, whatever it costs. What the oracle saves in target calls
per answer against the lossless rule, free-running, is the headroom of a judge of the
slot's own inputs on that task and pair: it knows, at each draft, what no such judge
can. The decoders call ``block_acceptance`` for a rule with ``decides_blocks``.
"""

from __future__ import annotations

import numpy as np

from evolve.data.decode import sample_rows
from evolve.data.continuations import continue_text


class AnswerOracle:
    """A decoder rule that keeps exactly the harmless drafts (see the module)."""

    residual = "standard"
    scope = "top_k"
    decides_blocks = True

    def __init__(self, seed: int = 0, no_longer: bool = True):
        self.seed = seed
        self.no_longer = no_longer
        self.name = "oracle" if no_longer else "answer oracle"
        self.calls = 0                  # blocks judged: the uniforms of each block's draws
        self.judged = self.kept = 0     # drafts the lossless rule could reject; kept

    def block_acceptance(self, pair, ctxs, X, P, Q, gen_before, greedy: bool) -> np.ndarray:
        """Acceptance probabilities (B, g) of a block's drafts ``X`` at their contexts
        ``ctxs`` (B, g, C), ``P``, ``Q`` (B, g, V) the target's and the draft's
        distributions there, ``gen_before`` (B,) the tokens generated before the block:
        1 for a harmless draft the lossless rule could reject, the lossless rule's
        acceptance for every other."""
        B, g = X.shape
        rows = np.arange(B)[:, None]
        cols = np.arange(g)[None, :]
        px, qx = P[rows, cols, X], Q[rows, cols, X]
        top = np.argmax(P, axis=2)
        std = (X == top).astype(np.float64) if greedy else np.minimum(1.0, px / qx)
        ask = np.argwhere(X != top if greedy else px < qx)
        self.calls += 1
        if ask.size == 0:
            return std
        b, j = ask[:, 0], ask[:, 1]
        ctx = ctxs[b, j]
        limit = pair.max_new("test")
        position = gen_before[b] + j
        if pair.max_tokens is not None:
            limit = np.minimum(limit, pair.max_tokens - 1 - position)
        u = np.random.default_rng((self.seed, self.calls)).random((b.size, int(np.max(
            limit, initial=1)) + 1))
        sub = np.concatenate([ctx, X[b, j].astype(ctx.dtype)[:, None]], axis=1)
        own_next = top[b, j] if greedy else sample_rows(P[b, j], u[:, 0])
        own = np.concatenate([ctx, own_next.astype(ctx.dtype)[:, None]], axis=1)
        keep = position + 1                      # the generated text, not the prompt
        a, _, _ = continue_text(pair, sub, greedy, u[:, 1:], pair.done_of, limit, pair.pad,
                                keep)
        o, _, _ = continue_text(pair, own, greedy, u[:, 1:], pair.done_of, limit, pair.pad,
                                keep)
        harmless = np.array([pair.answer_of(x) == pair.answer_of(y)
                             and (not self.no_longer or len(x) <= len(y))
                             for x, y in zip(a, o)])
        out = std.copy()
        out[b[harmless], j[harmless]] = 1.0
        self.judged += int(b.size)
        self.kept += int(harmless.sum())
        return out

    def many(self, F):                       # a decoder that cannot give it contexts
        raise TypeError("the answer oracle decides whole blocks with the pair "
                        "(block_acceptance); this decoder does not support it")
