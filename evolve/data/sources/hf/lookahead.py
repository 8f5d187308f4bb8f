"""The emitted distribution of a rule that reads the lookahead inputs, estimated at a
random sample of the reached slots of a Hugging Face pair's free-running decoding.

The estimate is the n-gram pair's (``evolve.data.lookahead_emission``): the later
drafts that the lookahead inputs of slots <= j read sampled from the draft after
candidates at slot j, and the tilt of reaching j. What differs is how the models are
read: they read the whole history, so each sampled slot's history (the prompt, the
text emitted before its block, and the block's accepted drafts before j) is read
once per model, its KV cache kept and repeated for the continuations
(``Cache.batch_repeat_interleave``; where a release's cache lacks it, every
continuation is read with the whole history instead: the same distributions, slower),
and the continuations' one to three tokens are read after it, as many at once as
keep the repeated cache within CACHE_BYTES.

A real vocabulary makes every candidate too many: 49,152 candidates with 8 futures
each are 393,216 continuations per slot (an hour and more of a 135M model on two
CPU cores, and their distributions 150 GB). Above EVERY_UP_TO tokens the later drafts
are sampled after the draft's CANDIDATES most likely tokens; the rest take the most
likely one's. Each slot reports how far that can move its TV at worst (``bound``),
and its TV with a quarter of the candidates: how far it moves in fact. On the real
pair (SmolLM2-135M-Instruct), the slot TVs with 16 and 64 candidates were within
0.00004 and 0.00002 of those with 256, at 2.9, 10.0 and 55.6 s a slot on 2 CPU cores
(``python -m benchmarks.experiments.lookahead_candidates``, its results file).
"""

from __future__ import annotations

import copy

import numpy as np

from evolve.data import emission as EM
from evolve.data import lookahead_emission as LE
from evolve.data.sources.hf import device as DV
from evolve.data.sources.hf.cache import call_names

# the continuations read at once: as many as keep one model's repeated KV cache within
# this many bytes (at most MAX_ROWS), so that a real model's long history fits in memory
CACHE_BYTES = 512 << 20
MAX_ROWS = 512
# the draft's candidates at a slot whose later drafts are sampled (the most likely first)
# where the vocabulary has more than EVERY_UP_TO tokens: a real vocabulary's every
# candidate is tens of thousands of continuations per slot; a byte-level one's, every one
CANDIDATES = 16
EVERY_UP_TO = 1024


def candidates_of(vocab: int) -> int | None:
    """The candidates whose later drafts a vocabulary of ``vocab`` tokens samples (None:
    every one)."""
    return CANDIDATES if vocab > EVERY_UP_TO else None


def rows_per_read(model, length: int) -> int:
    """How many continuations of a ``length``-token history one read takes: the repeated
    KV cache (keys and values of every layer, float32) within CACHE_BYTES."""
    c = model.config
    layers = getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", 1)
    heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", 1)
    kv = getattr(c, "num_key_value_heads", None) or heads
    width = getattr(c, "head_dim", None) or (getattr(c, "hidden_size", None)
                                             or getattr(c, "n_embd", 1)) // heads
    per_row = 2 * layers * kv * width * 4 * max(1, length)
    return max(1, min(MAX_ROWS, CACHE_BYTES // per_row))


class History:
    """Both models after one history (L,): their distributions at every position of
    it, and after it followed by rows of further tokens (``after``). Each model reads
    the history once; its KV cache is kept and repeated for the rows."""

    def __init__(self, pair, history: np.ndarray, repeat_cache: bool = True):
        import torch  # lazy: the core install has no torch
        self.pair = pair
        self.ids = torch.as_tensor(np.asarray(history, dtype=np.int64),
                                   device=pair.device)[None]
        self.dists, self.pasts = [], []
        with torch.no_grad():
            for model in (pair.target, pair.draft):
                out = self._read(model, self.ids, None, use_cache=repeat_cache)
                self.dists.append(self._probs(out.logits[0]))
                past = getattr(out, call_names(model)[0], None) if repeat_cache else None
                self.pasts.append(past if hasattr(past, "batch_repeat_interleave") else None)

    def _probs(self, logits) -> np.ndarray:
        return DV.probs(logits, self.pair.vocab, self.pair.config.temperature).cpu().numpy()

    def _read(self, model, ids, past, use_cache: bool, start: int = 0, keep: int = 0):
        import torch  # lazy: the core install has no torch
        arg, keeps = call_names(model)
        n, d = ids.shape
        pos = torch.arange(start, start + d, device=ids.device).expand(n, d)
        mask = torch.ones((n, start + d), dtype=torch.int64, device=ids.device)
        kw = {"logits_to_keep": keep} if keep and keeps else {}
        if past is not None:
            kw[arg] = past
        return model(input_ids=ids, attention_mask=mask, position_ids=pos,
                     use_cache=use_cache, **kw)

    def slots(self, start: int, j: int):
        """(P, Q), (j + 1, V): the distributions at slots 0 .. j of the block that starts
        at index ``start`` of the history (slot i predicts the token at start + i)."""
        return tuple(d[start - 1:start + j] for d in self.dists)

    def after(self, appended: np.ndarray):
        """p, q (N, V) after the history followed by each row of ``appended`` (N, d)."""
        import torch  # lazy: the core install has no torch
        L = self.ids.shape[1]
        app = torch.as_tensor(np.asarray(appended, dtype=np.int64), device=self.ids.device)
        out = []
        with torch.no_grad():
            for model, base in zip((self.pair.target, self.pair.draft), self.pasts):
                parts = []
                step = rows_per_read(model, L + app.shape[1])
                for s in range(0, app.shape[0], step):
                    rows = app[s:s + step]
                    n = rows.shape[0]
                    if base is not None:
                        past = copy.deepcopy(base)
                        past.batch_repeat_interleave(n)
                        o = self._read(model, rows, past, use_cache=True, start=L, keep=1)
                    else:
                        o = self._read(model, torch.cat([self.ids.expand(n, L), rows], dim=1),
                                       None, use_cache=False, keep=1)
                    parts.append(self._probs(o.logits[:, -1]))
                out.append(np.concatenate(parts))
        return out[0], out[1]


def block_starts(prompt_lens: np.ndarray, accepted: np.ndarray) -> np.ndarray:
    """(n, blocks): the index in each sequence's history where each block starts (an
    ended sequence's later blocks, counted -1, emit nothing)."""
    emitted = np.where(accepted >= 0, accepted + 1, 0)
    return prompt_lens[:, None] + np.cumsum(emitted, axis=1) - emitted


def estimate(fp, rule, prompt_lens: np.ndarray, accepted: np.ndarray, tracked: dict,
             seed: int, slots: int, futures: int, repeat_cache: bool = True,
             progress=None, candidates: int | None | str = "auto"):
    """Estimated TV and KL at a random sample of the reached slots (each weighing 1 / its
    sampling probability in the per-sequence sums; the sample is drawn as the n-gram
    pair's), the same at half the futures, and which rows of ``tracked`` (the
    decoder's reached slots: ``sequence``, ``block``, ``block_position``, ``history``)
    they are: (rows, tv, kl, tv_half, cut). ``candidates``: the later drafts are sampled
    after the draft's ``candidates`` most likely tokens only ("auto": ``candidates_of``
    the pair's vocabulary; None: every token, and ``cut`` is None); ``cut`` then holds
    ``candidates``, each slot's ``bound`` on how far that can move its TV
    (``lookahead_emission.slot_emission``: a worst case) and its TV with a quarter of
    the candidates (``tv_quarter``, the same futures' stream: how much the cut moves
    it in fact). ``progress(1)`` after each slot."""
    if candidates == "auto":
        candidates = candidates_of(fp.pair.vocab)
    rows = LE.sample_slots(tracked["sequence"].size, slots, seed)
    starts = block_starts(np.asarray(prompt_lens, dtype=np.int64), accepted)
    tv, kl, tv_half, bound, tv_quarter = (np.empty(rows.size) for _ in range(5))
    runs = [(futures, 0, candidates), (max(1, futures // 2), 1, candidates)]
    if candidates is not None:
        runs.append((futures, 0, max(1, candidates // 4)))
    for out_i, row in enumerate(rows):
        s = int(tracked["sequence"][row])
        t, j = int(tracked["block"][row]), int(tracked["block_position"][row])
        start = int(starts[s, t])
        hist = np.asarray(tracked["history"][s])
        h = History(fp.pair, hist[:start + j], repeat_cache)
        P, Q = h.slots(start, j)
        block = {"token": hist[start:start + j + 1],
                 "position": start - int(prompt_lens[s]) + np.arange(j + 1),
                 "block_position": np.arange(j + 1),
                 "slot_tv": np.maximum(Q - P, 0.0).sum(axis=1)}
        for n, (m, stream, cands) in enumerate(runs):
            info: dict = {}
            e = LE.slot_emission(fp, rule, block, j, m,
                                 np.random.default_rng((seed, int(row), stream)),
                                 dists=(P, Q), after=h.after, candidates=cands, info=info)
            d_tv, d_kl = EM.distortion(P[j:j + 1], e[None])
            if n == 0:
                tv[out_i], kl[out_i], bound[out_i] = d_tv[0], d_kl[0], info["bound"]
            elif n == 1:
                tv_half[out_i] = d_tv[0]
            else:
                tv_quarter[out_i] = d_tv[0]
        if progress is not None:
            progress(1)
    cut = None if candidates is None else {
        "candidates": int(candidates), "bound": np.minimum(bound, 1.0),
        "quarter": max(1, candidates // 4), "tv_quarter": tv_quarter}
    return rows, tv, kl, tv_half, cut
