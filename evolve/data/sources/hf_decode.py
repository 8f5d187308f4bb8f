"""Speculative decoding with a Hugging Face pair: two passes per block.

Per block of ``g`` drafted tokens, for a batch of sequences (left-padded, with
attention masks and explicit position ids):

1. the draft reads the history once (prefill) and samples ``x_1 .. x_g``
   autoregressively from ``q`` with its KV cache, one token per step;
2. the target scores history + block teacher-forced in ONE forward pass, giving
   ``p`` at the ``g`` drafted positions and the bonus position.

Acceptance is the standard rule ``u_j < min(1, p_j(x_j) / q_j(x_j))`` (or, for
free-running comparisons, a given rule on the draft's top-k tokens); the
longest accepted prefix is kept, then one more token is drawn from
``norm(max(0, p - q))`` at the first rejection (or from ``p_{g+1}``; an
engine's knob judges every draft and uses its own residual, as in
``evolve.data.decode``). Every
drafted position is recorded (also those after the first rejection), with the
same columns and conventions as ``evolve.data.decode`` (the n-gram decoder):
top-k candidates of ``q``, tail masses, entropies, p_max, q_max. Probabilities
are softmax(logits / temperature) in float64 (logits of any model dtype), with a
floor of the smallest normal double so that no recorded probability is 0.

No KV cache is kept across blocks: each block re-reads the history (simple and
exact; the cost grows with the history, which is fine for recording traces).
"""

from __future__ import annotations

import inspect

import numpy as np

from evolve.data.decode import (block_records, candidate_summary, drafted_acceptance,
                                rejection_residual, residual_kind, sample_rows,
                                sequence_major)
from evolve.data.emission import slot_distortion
from evolve.data.traces import CONTEXT_PAD

PROB_FLOOR = np.finfo(np.float64).tiny


def probs(logits, vocab: int, temperature: float) -> np.ndarray:
    """softmax(logits[..., :vocab] / temperature) as float64 numpy, floored."""
    import torch
    x = logits[..., :vocab].to(torch.float64) / temperature
    return np.maximum(torch.softmax(x, dim=-1).cpu().numpy(), PROB_FLOOR)


def _keep_kw(model, n: int) -> dict:
    """Ask for the last n positions' logits only, where the model supports it."""
    params = inspect.signature(model.forward).parameters
    return {"logits_to_keep": n} if "logits_to_keep" in params else {}


def decode(pair, prompts: list, rngs, blocks: int, record: bool = True, rule=None,
           track: bool = False):
    """Speculative decoding of every prompt (token id arrays) for ``blocks`` blocks.

    All uniforms of a prompt are drawn from its generator up front: draft (blocks, g),
    accept (blocks, g), resample/bonus (blocks,). ``rule=None`` is the standard rule
    (the trace recorder); otherwise ``rule`` (``many(features) -> thresholds``)
    decides drafts among the draft's top-k tokens and the standard rule the others,
    as in ``evolve.data.decode``. Returns ``(columns, accepted)``: the v1 + v2 columns
    of every drafted position (None unless ``record``; not with a rule) and the
    accepted draft count of every block, int64 (n, blocks). With ``track`` (and a
    rule), a third value: the exact TV and KL of the emitted token at every drafted
    position the rule reached (``evolve.data.emission``; with its ``sequence``,
    ``block`` and ``block_position``), and ``history``, each sequence's decoded
    token ids."""
    cfg = pair.config
    g, k, C, batch = cfg.block_size, cfg.top_k, cfg.context_len, cfg.batch_size
    if rule is not None and record:
        raise ValueError("hf decode: traces are recorded with the standard rule only")
    if track and rule is None:
        raise ValueError("hf decode: tracking the distortion needs a rule")
    n = len(prompts)
    check_lengths(pair, prompts, blocks)
    U = (np.stack([r.random((blocks, 2 * g + 1)) for r in rngs]) if n
         else np.zeros((0, blocks, 2 * g + 1)))
    parts, accepted, tracked = [], [], []
    for s0 in range(0, n, batch):
        cols, n_acc, tr = _decode_batch(pair, prompts[s0:s0 + batch], U[s0:s0 + batch],
                                        blocks, g, k, C, s0, record, rule, track)
        parts.append(cols)
        accepted.append(n_acc)
        tracked.append(tr)
    cols = ({f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
            if record and parts else None)
    acc = np.concatenate(accepted) if accepted else np.zeros((0, blocks), dtype=np.int64)
    if not track:
        return cols, acc
    out = {f: np.concatenate([t[f] for t in tracked]) if tracked else np.zeros(0)
           for f in TRACKED}
    out["history"] = [h for t in tracked for h in t["history"]]
    return cols, acc, out


TRACKED = ("sequence", "block", "block_position", "tv", "kl")


def check_lengths(pair, prompts: list, blocks: int) -> None:
    """ValueError unless the longest sequence fits both models' position tables."""
    check_fits(pair, max((len(p) for p in prompts), default=0), blocks)


def check_fits(pair, longest_prompt: int, blocks: int) -> None:
    """ValueError unless a prompt of ``longest_prompt`` tokens decoded for ``blocks``
    blocks fits both models' position tables."""
    longest = longest_prompt + blocks * (pair.config.block_size + 1)
    for name in ("target", "draft"):
        limit = pair.info[name]["max_positions"]
        if limit is not None and longest > limit:
            raise ValueError(f"--{name}: sequences reach {longest} tokens (longest prompt + "
                             f"blocks x (g + 1)); the model takes at most {limit}")


def block_inputs(hist, g):
    """Left-padded ids (B, L + g), mask and position ids for histories + a block."""
    B = len(hist)
    L = max(len(h) for h in hist)
    ids = np.zeros((B, L + g), dtype=np.int64)
    mask = np.zeros((B, L + g), dtype=np.int64)
    for i, h in enumerate(hist):
        ids[i, L - len(h):L] = h
        mask[i, L - len(h):] = 1
    pos = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    return ids, mask, pos, L


def _draft_block(pair, ids, mask, pos, L, g, U_t):
    """Sample g tokens from the draft with its KV cache; (Q (B, g, V), X (B, g))."""
    import torch
    dev, V, temp = pair.device, pair.vocab, pair.config.temperature
    B = ids.shape[0]
    m = torch.from_numpy(mask).to(dev)
    p = torch.from_numpy(pos).to(dev)
    out = pair.draft(input_ids=torch.from_numpy(ids[:, :L]).to(dev), attention_mask=m[:, :L],
                     position_ids=p[:, :L], use_cache=True, **_keep_kw(pair.draft, 1))
    Q = np.empty((B, g, V))
    for j in range(g):
        Q[:, j] = probs(out.logits[:, -1], V, temp)
        ids[:, L + j] = sample_rows(Q[:, j], U_t[:, j])
        if j + 1 < g:
            out = pair.draft(input_ids=torch.from_numpy(ids[:, L + j:L + j + 1]).to(dev),
                             attention_mask=m[:, :L + j + 1], position_ids=p[:, L + j:L + j + 1],
                             past_key_values=out.past_key_values, use_cache=True)
    return Q, ids[:, L:].copy()


def _target_block(pair, ids, mask, pos, g):
    """p at the g drafted positions and the bonus position: (B, g + 1, V), one pass."""
    import torch
    dev = pair.device
    out = pair.target(input_ids=torch.from_numpy(ids).to(dev),
                      attention_mask=torch.from_numpy(mask).to(dev),
                      position_ids=torch.from_numpy(pos).to(dev), use_cache=False,
                      **_keep_kw(pair.target, g + 1))
    return probs(out.logits[:, -(g + 1):], pair.vocab, pair.config.temperature)


def _contexts(hist, X, C):
    """(B * g, C) int32: the C tokens before each drafted position, left-padded."""
    B, g = X.shape
    ctx = np.full((B, g, C), CONTEXT_PAD, dtype=np.int32)
    for i, h in enumerate(hist):
        full = np.concatenate([h, X[i]])
        for j in range(g):
            before = full[:len(h) + j][-C:]
            ctx[i, j, C - len(before):] = before
    return ctx.reshape(B * g, C)


def _decode_batch(pair, prompts, U, blocks, g, k, C, seq0, record, rule, track):
    import torch
    B = len(prompts)
    hist = [np.asarray(p, dtype=np.int64) for p in prompts]
    L0 = np.array([len(h) for h in hist], dtype=np.int64)
    rows = np.arange(B)
    rec: dict[str, list] = {}
    tr: dict[str, list] = {f: [] for f in TRACKED}
    accepted = np.zeros((B, blocks), dtype=np.int64)
    tok_dtype = np.int32 if pair.vocab < 2 ** 31 else np.int64

    def put(name, arr):
        rec.setdefault(name, []).append(arr)

    for t in range(blocks):
        gen_before = np.array([len(h) for h in hist], dtype=np.int64) - L0
        ids, mask, pos, L = block_inputs(hist, g)
        with torch.no_grad():
            Q, X = _draft_block(pair, ids, mask, pos, L, g, U[:, t])
            P = _target_block(pair, ids, mask, pos, g)
        V = Q.shape[2]
        qx = np.take_along_axis(Q, X[:, :, None], axis=2)[:, :, 0]
        px = np.take_along_axis(P[:, :g], X[:, :, None], axis=2)[:, :, 0]
        rand = U[:, t, g:2 * g]
        Pg, Qg = P[:, :g].reshape(B * g, V), Q.reshape(B * g, V)
        if record or rule is not None:
            cs = candidate_summary(Pg, Qg, k, token_dtype=tok_dtype)
        a_x = (np.minimum(1.0, px / qx) if rule is None
               else drafted_acceptance(rule, Pg, Qg, X, qx, px, gen_before, cs))
        acc = rand < a_x
        n_acc = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1))
        accepted[:, t] = n_acc
        Pn = P[rows, n_acc]
        Qn = np.where((n_acc < g)[:, None], Q[rows, np.minimum(n_acc, g - 1)], 0.0)
        Rn = rejection_residual(residual_kind(rule), Pn, Qn, X[rows, np.minimum(n_acc, g - 1)])
        new = sample_rows(np.where((n_acc < g)[:, None], Rn, Pn), U[:, t, 2 * g])
        if track:
            _track(tr, Pg, Qg, gen_before, n_acc, rule, k, seq0, t)
        if record:
            for f, v in block_records(Pg, Qg, X, qx, px, rand, acc, cs, gen_before,
                                      seq0 + rows, t).items():
                put(f, v)
            put("context", _contexts(hist, X, C) if C else np.zeros((B * g, 0), np.uint8))
        hist = [np.concatenate([h, X[i, :n_acc[i]], new[i:i + 1]]) for i, h in enumerate(hist)]
    tracked = None
    if track:
        tracked = {f: np.concatenate(v) for f, v in tr.items()}
        tracked["history"] = hist
    return (sequence_major(rec, blocks, B, g) if record else None), accepted, tracked


def _track(tr: dict, Pg, Qg, gen_before, n_acc, rule, k: int, seq0: int, t: int) -> None:
    """The exact distortion of the emitted token at the block's reached positions."""
    B = n_acc.size
    g = Pg.shape[0] // B
    j = np.tile(np.arange(g), B)
    seq = np.repeat(np.arange(B), g)
    idx = np.flatnonzero(j <= n_acc[seq])
    tv, kl = slot_distortion(Pg[idx], Qg[idx], gen_before[seq[idx]] + j[idx], j[idx], rule, k)
    for f, v in (("sequence", seq0 + seq[idx]), ("block", np.full(idx.size, t)),
                 ("block_position", j[idx]), ("tv", tv), ("kl", kl)):
        tr[f].append(v)
