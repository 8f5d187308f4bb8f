"""Which continuations a split's labels need, and which of them are one.

A label compares two texts of a row (``evolve.data.labels``): the draft's token
substituted and continued (*sub*), and the target's own token continued (*own*).
Each text is a ``Use``: the row, its first token, tokens already known to follow
it, and a ``Chain``, a continuation computed once from a history (a row's context
and a few tokens after it) for every use that reaches it. A use's text is walked
through its known tokens first (its end and budget apply as if they were generated),
and only a use that is still going reads its chain, so a chain is computed only as far
as its furthest use needs, and not at all when none does.

Greedy decoding makes many of the texts one (a greedy continuation is a function of
its history alone). In a block of g drafts x_0..x_(g-1) with the target's argmaxes
a_0..a_(g-1) (recorded as ``target_top``), the rows the standard rule could reject
are those with x_j != a_j, and m is the first of them:

- own_m starts with a_m at the end of the block's accepted drafts: the recorded
  standard-rule text *is* that greedy continuation, so its tokens are known up to
  where the recording stops (then the problem's *tail* chain continues it);
- sub_j continues x_j, whose history is the context of row j + 1: the continuation
  emits x_(j+1) while x_(j+1) = a_(j+1), then a_k at the next row k the rule could
  reject, and is own_k's text from there; past the block's last draft it is the
  block's *end* chain;
- own_k (k > m) is a chain of its own, shared with the sub texts that reach it.

So a block with r rows to label computes at most r chains (own_k for the r - 1 rows
after m, and the end chain) instead of 2 r. The recorded text of a problem is read
from its blocks: the accepted drafts and the target's argmax after them (the next
block's context holds a fully accepted block's bonus token).

In sampling the texts draw their own uniforms (``evolve.data.labels.row_uniforms``), so no text is
the recording's or another row's; the one that reuse finds is a row whose own draw
is its draft: both texts are then the same tokens and the label is 0 with nothing
continued.

``Runner`` computes the chains a plan needs, in batches the pair sizes to a memory
bound (``mining_row_bytes``), through ``continuations.continue_text``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from evolve.data.continuations import continue_text, text_of

DEFAULT_ROWS = 2048       # continuations computed together when a pair cannot size them


@dataclass
class Chain:
    """A continuation computed once: from the history ``context[row] + extra``."""
    row: int
    extra: tuple
    uniform: int = -1          # sampling: the labelled row whose uniforms it draws
    steps: int = 0             # tokens its furthest use needs (0: not computed)


@dataclass
class Use:
    """One of a label's two texts: the row, its first token, the tokens known to follow
    it, and the chain that continues it (-1: none)."""
    row: int
    first: int
    known: list = field(default_factory=list)
    chain: int = -1


@dataclass
class Plan:
    uses: list                 # per labelled row: (sub, own), or None (the same text)
    chains: list


def plan(cols: dict, rows: np.ndarray, draws: np.ndarray, greedy: bool,
         reuse: bool) -> Plan:
    """The uses and chains of the labelled ``rows`` (whole problems' rows) whose own
    first tokens are ``draws`` (greedy: the target's argmax)."""
    token = np.asarray(cols["token"])
    if not reuse:
        chains, uses = [], []
        for i, r in enumerate(rows):
            pair_ = []
            for first in (int(token[r]), int(draws[i])):
                chains.append(Chain(int(r), (first,), -1 if greedy else i))
                pair_.append(Use(int(r), first, [], len(chains) - 1))
            uses.append(tuple(pair_))
        return Plan(uses, chains)
    if not greedy:
        chains, uses = [], []
        for i, r in enumerate(rows):
            if int(draws[i]) == int(token[r]):
                uses.append(None)
                continue
            pair_ = []
            for first in (int(token[r]), int(draws[i])):
                chains.append(Chain(int(r), (first,), i))
                pair_.append(Use(int(r), first, [], len(chains) - 1))
            uses.append(tuple(pair_))
        return Plan(uses, chains)
    return _greedy_plan(cols, rows)


def _blocks(cols: dict) -> int:
    """g, the drafts of a block (the recording's blocks are whole)."""
    return int(np.max(cols["block_position"])) + 1 if len(cols["token"]) else 1


def recorded_text(cols: dict, lo: int, hi: int, g: int):
    """The generated text of the problem whose rows are [lo, hi) as the standard rule
    emitted it (greedy): each block's accepted drafts and the target's argmax after them
    (a fully accepted block's bonus is the last token of the next block's context;
    unknown after the last block). None when the rows are not whole blocks in order."""
    x = np.asarray(cols["token"][lo:hi])
    a = np.asarray(cols["target_top"][lo:hi])
    pos = np.asarray(cols["position"][lo:hi])
    bp = np.asarray(cols["block_position"][lo:hi])
    if (hi - lo) % g or not np.array_equal(bp, np.tile(np.arange(g), (hi - lo) // g)):
        return None
    text: list = []
    for b0 in range(0, hi - lo, g):
        if pos[b0] != len(text):
            return None
        miss = np.flatnonzero(x[b0:b0 + g] != a[b0:b0 + g])
        if miss.size:
            m = int(miss[0])
            text += x[b0:b0 + m].tolist() + [int(a[b0 + m])]
        else:
            text += x[b0:b0 + g].tolist()
            if b0 + g < hi - lo:
                text.append(int(cols["context"][lo + b0 + g][-1]))
    return text


def _greedy_plan(cols: dict, rows: np.ndarray) -> Plan:
    x_all = np.asarray(cols["token"])
    a_all = np.asarray(cols["target_top"])
    seq = np.asarray(cols["sequence"])
    pos = np.asarray(cols["position"])
    g = _blocks(cols)
    chains: list = []
    index: dict = {}
    uses: dict = {}

    def node(key, row, extra) -> int:
        if key not in index:
            index[key] = len(chains)
            chains.append(Chain(int(row), tuple(int(t) for t in extra)))
        return index[key]

    ordered = bool(np.all(np.diff(seq) >= 0))
    for s in np.unique(seq[rows]):
        lo, hi = ((int(np.searchsorted(seq, s, "left")), int(np.searchsorted(seq, s, "right")))
                  if ordered else (0, 0))
        text = recorded_text(cols, lo, hi, g) if hi > lo else None
        if text is None:           # not whole blocks in order: every text computed
            for r in rows[seq[rows] == s]:
                uses[int(r)] = (Use(int(r), int(x_all[r]), [], node(("sub", r), r, [x_all[r]])),
                                Use(int(r), int(a_all[r]), [], node(("own", r), r, [a_all[r]])))
            continue
        for b0 in range(lo, hi, g):
            x, a = x_all[b0:b0 + g], a_all[b0:b0 + g]
            miss = np.flatnonzero(x != a)
            if not miss.size:
                continue
            m = int(miss[0])
            for j in miss:
                r = b0 + int(j)
                if j == m:         # the recorded text continues a_m
                    own = Use(r, int(a[j]), text[pos[r] + 1:], node(("tail", s), lo, text))
                else:
                    own = Use(r, int(a[j]), [], node(("own", r), r, [a[j]]))
                known, k = [], int(j) + 1
                while k < g and x[k] == a[k]:
                    known.append(int(x[k]))
                    k += 1
                if k < g:
                    known.append(int(a[k]))
                    chain = node(("own", b0 + k), b0 + k, [a[k]])
                else:
                    chain = node(("end", b0), b0 + g - 1, [x[g - 1]])
                uses[r] = (Use(r, int(x[j]), known, chain), own)
    return Plan([uses[int(r)] for r in rows], chains)


class Runner:
    """Computes what a plan needs with a pair's target, counting the target rows read
    (``passes``), its batched calls (``calls``) and the chains computed; ``last_chains``
    keeps the tokens each chain generated in the last ``texts``."""

    def __init__(self, pair, cols: dict, greedy: bool, done_of, pad, max_rows=None,
                 max_memory=None):
        self.pair, self.cols, self.greedy = pair, cols, greedy
        self.done_of, self.pad = done_of, pad
        self.max_rows, self.max_memory = max_rows, max_memory
        self.context = cols["context"]
        self.position = np.asarray(cols["position"])
        self.passes = self.calls = self.computed = 0
        self.last_chains: dict = {}

    def rows_for(self, hist_len: int, steps: int) -> int:
        """Continuations computed together: ``max_rows``, or as many as the memory
        bound holds by the pair's estimate of a row's bytes, or ``DEFAULT_ROWS``."""
        if self.max_rows:
            return int(self.max_rows)
        per_row = getattr(self.pair, "mining_row_bytes", None)
        if per_row is None:
            return DEFAULT_ROWS
        memory = (self.max_memory if self.max_memory is not None
                  else self.pair.mining_memory())
        return max(1, int(memory // max(1, per_row(hist_len, steps))))

    def _continue(self, hist, keep, limit, uniforms, done_of):
        texts, p, c = continue_text(self.pair, hist, self.greedy, uniforms, done_of, limit,
                                       self.pad, keep)
        self.passes += p
        self.calls += c
        return texts

    def first_tokens(self, rows: np.ndarray, u0: np.ndarray) -> np.ndarray:
        """The target's own draw at each row's context (sampling), from ``u0``."""
        out = np.empty(rows.size, dtype=np.int64)
        ctx = self.context
        n = self.rows_for(ctx.shape[1] if rows.size else 0, 1)
        for s in range(0, rows.size, n):
            r = rows[s:s + n]
            texts = self._continue(np.asarray(ctx[r]), None, 1, u0[s:s + n, None],
                                   lambda t: False)
            out[s:s + n] = [t[-1] for t in texts]
        return out

    def _history(self, row: int, extra) -> np.ndarray:
        c = np.asarray(self.context[row])
        return np.concatenate([c, np.asarray(extra, dtype=c.dtype)])

    def walk(self, use: Use, limit: int):
        """(text, tokens still needed from the use's chain: 0 when it has ended) of a
        use walked through its known tokens (``done_of`` holds for every longer text
        once it holds, so the end among them is found by bisection)."""
        done_of = self.done_of
        text = text_of(self._history(use.row, [use.first]), self.pad,
                          int(self.position[use.row]) + 1)
        if limit <= 0 or done_of(text):
            return text, 0
        known = use.known[:limit]
        if known and done_of(text + known):
            lo, hi = 0, len(known)          # done_of(text + known[:hi]) holds, [:lo] not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if done_of(text + known[:mid]):
                    hi = mid
                else:
                    lo = mid
            return text + known[:hi], 0
        text = text + known
        if len(known) >= limit or use.chain < 0:
            return text, 0
        return text, limit - len(known)

    def texts(self, p: Plan, limit: np.ndarray, uniforms) -> list:
        """(sub text, own text) of every labelled row of the plan ((None, None) where the
        two are one)."""
        walked = []
        for i, pair_ in enumerate(p.uses):
            if pair_ is None:
                walked.append(None)
                continue
            w = []
            for use in pair_:
                text, need = self.walk(use, int(limit[i]))
                if need:
                    ch = p.chains[use.chain]
                    ch.steps = max(ch.steps, need)
                w.append((text, use.chain, need))
            walked.append(w)
        tokens = self.last_chains = self.run_chains(p.chains, uniforms)
        out = []
        for w in walked:
            if w is None:
                out.append((None, None))
                continue
            out.append(tuple(text + tokens[c][:need] if need else text
                             for text, c, need in w))
        return out

    def run_chains(self, chains: list, uniforms) -> dict:
        """chain index -> the tokens it generated, for every chain some use needs."""
        todo = [i for i, ch in enumerate(chains) if ch.steps > 0]
        out: dict = {}
        if not todo:
            return out
        hists = [self._history(chains[i].row, chains[i].extra) for i in todo]
        width = max(h.size for h in hists)
        steps = max(chains[i].steps for i in todo)
        n = self.rows_for(width, steps)
        for s in range(0, len(todo), n):
            part = todo[s:s + n]
            hs = hists[s:s + n]
            L = max(h.size for h in hs)
            hist = np.full((len(part), L), self.pad, dtype=hs[0].dtype)
            for b, h in enumerate(hs):
                hist[b, L - h.size:] = h
            keep = np.array([self.position[chains[i].row] + len(chains[i].extra)
                             for i in part])
            limit = np.array([chains[i].steps for i in part])
            u = None
            if not self.greedy:
                u = np.stack([uniforms[chains[i].uniform] for i in part])
            texts = self._continue(hist, keep, limit, u, self.done_of)
            for b, i in enumerate(part):
                start = len(text_of(hist[b], self.pad, keep[b]))
                out[i] = texts[b][start:]
            self.computed += len(part)
        return out
