"""KV caches kept across blocks for a batch of sequences (``evolve.data.sources.hf.decode``).

One column layout serves the batch and both models: column c of every row holds
one token, ``mask[:, c]`` says whether it belongs to the row's history, and
``pos[:, c]`` is its position id (the number of history tokens before it).
Prompts are left-padded (pad columns masked). Each block appends g + 1 columns:
the pending token (the last one emitted, which neither model has read yet) and
the g drafts. After verification the rejected drafts' columns become holes
(mask 0): they stay in both caches and no later query attends to them, so a
rollback is a mask update, the same for every model and every cache class, and
rows that accepted different counts keep one cache length. The draft reads the
block's columns up to x_{g-1} while drafting and x_g (a hole or not) with the
next block's first step; the target reads all g + 1 in one pass.

This uses only what every supported transformers release has: a model called
with its cache argument (``past_key_values``, named ``cache`` in later
releases: read from the signature; None at first, then what it returned), a 2-D
``attention_mask`` over all columns so far and explicit ``position_ids``; the one
cache method called is ``batch_select_indices``, by the label miner to drop rows that
have ended (``Cached.select``; a cache without it keeps every row). Holes cost memory: a batch's cache holds prompt + blocks
x (g + 1) columns.
"""

from __future__ import annotations

import inspect

import numpy as np


class Layout:
    """The batch's columns: token ids, mask and position ids, preallocated."""

    def __init__(self, prompts: list, blocks: int, g: int, device):
        import torch  # lazy: the core install has no torch
        B = len(prompts)
        L = max(len(p) for p in prompts)
        cap = L - 1 + blocks * (g + 1)
        ids = np.zeros((B, cap), dtype=np.int64)
        mask = np.zeros((B, cap), dtype=np.int64)
        for i, p in enumerate(prompts):         # every prompt but its last token
            ids[i, L - len(p):L - 1] = p[:-1]
            mask[i, L - len(p):L - 1] = 1
        pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        self.ids = torch.from_numpy(ids).to(device)
        self.mask = torch.from_numpy(mask).to(device)
        self.pos = torch.from_numpy(pos).to(device)
        self.cols = L - 1
        self.npos = torch.tensor([len(p) - 1 for p in prompts], dtype=torch.int64,
                                 device=device)            # position of the pending token
        self.pending = torch.tensor([int(p[-1]) for p in prompts], dtype=torch.int64,
                                    device=device)

    def append(self, tokens) -> int:
        """Add one column of tokens (B,) at the next position of every row (as part of
        the history until ``settle``); its index."""
        c = self.cols
        off = c - self.block_start
        self.ids[:, c] = tokens
        self.mask[:, c] = 1
        self.pos[:, c] = self.npos + off
        self.cols = c + 1
        return c

    def open_block(self) -> None:
        """Start a block: the pending token becomes its first column."""
        self.block_start = self.cols
        self.append(self.pending)

    def select(self, rows) -> None:
        """Keep only the batch rows ``rows`` (a device tensor of indices, in order)."""
        for name in ("ids", "mask", "pos", "npos", "pending"):
            setattr(self, name, getattr(self, name).index_select(0, rows))

    def settle(self, n_acc, new) -> None:
        """Close the block: drafts after the first ``n_acc`` of each row become holes;
        ``new`` (B,) is each row's next pending token."""
        import torch  # lazy: the core install has no torch
        s = self.block_start
        g = self.cols - s - 1
        j = torch.arange(g, device=n_acc.device)
        self.mask[:, s + 1:s + 1 + g] = (j.unsqueeze(0) < n_acc.unsqueeze(1)).to(self.mask.dtype)
        self.npos = self.npos + n_acc + 1
        self.pending = new


def call_names(model) -> tuple[str, bool]:
    """The name of ``model``'s cache argument and output (later releases call it
    ``cache``, earlier ones ``past_key_values``) and whether it takes
    ``logits_to_keep``."""
    params = inspect.signature(model.forward).parameters
    return ("cache" if "cache" in params else "past_key_values"), "logits_to_keep" in params


class Cached:
    """One model reading the layout's columns in order, its KV cache kept."""

    def __init__(self, model):
        self.model = model
        self.past = None
        self.cols = 0
        self.arg, self.keep = call_names(model)

    def read(self, lay: Layout, end: int, keep: int):
        """Read columns [self.cols, end); the logits of the last ``keep`` of them."""
        start = self.cols
        kw = {"logits_to_keep": keep} if self.keep else {}
        out = self.model(input_ids=lay.ids[:, start:end], attention_mask=lay.mask[:, :end],
                         position_ids=lay.pos[:, start:end], use_cache=True,
                         **{self.arg: self.past}, **kw)
        self.past = getattr(out, self.arg)
        self.cols = end
        return out.logits[:, -keep:]

    def select(self, rows) -> bool:
        """Keep only the batch rows ``rows`` (a device tensor of indices, in order) of the
        cache: ``batch_select_indices``, the cache method transformers' own contrastive
        search compacts with, or each tensor of a legacy tuple cache. False (nothing
        changed) for a cache that has neither."""
        past = self.past
        if past is None:
            return True
        if hasattr(past, "batch_select_indices"):
            past.batch_select_indices(rows)
            return True
        if isinstance(past, tuple) and all(isinstance(layer, tuple) for layer in past):
            self.past = tuple(tuple(t.index_select(0, rows) for t in layer) for layer in past)
            return True
        return False

    def prefill(self, lay: Layout) -> None:
        """Read the prompts (all but their last tokens), if there is anything to read."""
        if lay.cols > 0:
            self.read(lay, lay.cols, 1)


def shared_prefixes(ids: list) -> tuple[list, np.ndarray]:
    """(bases, base of each history) of histories ``ids`` (arrays of token ids): each
    history but its last token is a prefix of its base, and a base is the longest such
    prefix of the histories it serves, so histories that continue one text (the
    rows of a recorded problem) share one. Longest histories first; a history joins the
    first base that starts with its prefix, else its prefix is a new base."""
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    bases: list = []
    base_of = np.empty(len(ids), dtype=np.int64)
    for i in order:
        head = ids[i][:-1]
        n = head.size
        for b, base in enumerate(bases):
            if base.size >= n and np.array_equal(base[:n], head):
                base_of[i] = b
                break
        else:
            base_of[i] = len(bases)
            bases.append(head)
    return bases, base_of


def prefill_shared(model, ids: list, steps: int, device):
    """(layout, cached model) of histories ``ids`` about to be continued ``steps``
    tokens, each read once where it is shared: every distinct base (``shared_prefixes``)
    is read once, its cache copied to each history it serves (the cache's
    ``batch_select_indices``, or a legacy tuple's tensors, with repeated rows), and
    each history's columns of its base past its own prefix become holes, as rejected
    drafts do. The history's last token is left pending, as ``Layout`` leaves a prompt's.
    None when the cache cannot copy rows (the caller reads each history whole)."""
    import torch  # lazy: the core install has no torch
    bases, base_of = shared_prefixes(ids)
    lay = Layout([np.append(b, 0) for b in bases], steps, 0, device)  # 0: never read
    cached = Cached(model)
    cached.prefill(lay)
    sel = torch.as_tensor(base_of, device=device)
    if cached.past is not None and not cached.select(sel):
        return None
    lay.select(sel)
    width = lay.cols                            # the bases' columns, right-aligned
    lens = np.array([b.size for b in bases])[base_of]
    own = np.array([len(h) - 1 for h in ids])   # each history's prefix in its base
    cut = torch.as_tensor(width - lens + own, device=device)
    cols = torch.arange(width, device=device)
    lay.mask[:, :width] *= (cols.unsqueeze(0) < cut.unsqueeze(1)).to(lay.mask.dtype)
    lay.npos = torch.as_tensor(own, dtype=torch.int64, device=device)
    lay.pending = torch.as_tensor([int(h[-1]) for h in ids], dtype=torch.int64,
                                  device=device)
    return lay, cached
