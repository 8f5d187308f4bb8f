"""Speculative decoding with a Hugging Face pair, on the models' device, KV caches kept.

For a batch of sequences (prompts of any lengths, left-padded), each block:

1. the draft reads the pending token (and the previous block's last draft) and
   samples ``x_1 .. x_g`` autoregressively from ``q``, one token per step, from
   its KV cache;
2. the target reads the pending token and the g drafts in ONE forward pass from
   its KV cache, giving ``p`` at the ``g`` drafted positions and the bonus position;
3. the drafts after the first rejection become holes in both caches
   (``evolve.data.sources.hf.cache``): nothing is re-read, ever.

Acceptance is the standard rule ``u_j < min(1, p_j(x_j) / q_j(x_j))`` (or, for
free-running comparisons, a given rule on the draft's top-k tokens); the
longest accepted prefix is kept, then one more token is drawn from
``norm(max(0, p - q))`` at the first rejection (or from ``p_{g+1}``; an
engine's knob judges every draft and uses its own residual, as in
``evolve.data.decode``). Every drafted position is recorded (also those after
the first rejection), with the columns and conventions of
``evolve.data.decode`` (the n-gram decoder): top-k candidates of ``q``, tail
masses, entropies, p_max, q_max and the schema-v3 slot features. A rule also
reads the lookahead inputs (``evolve.data.decode.lookahead_features``: the block's
later slots along its drafts), computed on the device from the slot TVs; the
exact distortion of a reached slot holds them at the path's values for every
token there (``evolve.data.emission``).
Probabilities are softmax(logits / temperature) in float64 (logits of any
model dtype), floored at the smallest normal double.

Everything per position is computed on the device in float64
(``evolve.data.sources.hf.device``), sampling included, with the uniforms drawn
up front per prompt exactly as before; the recorded columns leave the device
once per batch. A rule other than the standard one is numpy code: each block,
its B g rows of features go to the host and its thresholds come back; tracking
the distortion (``track``) does the same for the k candidates of each reached
slot, except for a rule that judges every draft (an engine's knob), whose
reached slots' full distributions go to the host (``evolve.data.emission``).
"""

from __future__ import annotations

import numpy as np

from evolve.data import vocab_class as VC
from evolve.data.decode import residual_kind, sequence_major
from evolve.data.emission import slot_distortion
from evolve.data.sources.hf import device as DV
from evolve.data.sources.hf.cache import Cached, Layout
from evolve.data.sources.hf.device import rejection_residual   # called by this name
from evolve.data.traces import CONTEXT_PAD
from evolve.lang.features import LOOKAHEAD_INPUT_NAMES


def probs(logits, vocab: int, temperature: float) -> np.ndarray:
    """softmax(logits[..., :vocab] / temperature) as float64 numpy, floored."""
    return DV.probs(logits, vocab, temperature).cpu().numpy()


def decode(pair, prompts: list, rngs, blocks: int, record: bool = True, rule=None,
           track: bool = False, progress=None, greedy: bool = False, end: int | None = None,
           max_tokens: int | None = None, history: bool = False, tick=None, done_of=None):
    """Speculative decoding of every prompt (token id arrays) for ``blocks`` blocks.

    ``greedy``, ``end`` and ``max_tokens`` decode as ``evolve.data.decode.decode``
    does (the task world): greedy drafts and verification (a target-argmax draft kept,
    a rule deciding the others, the target's argmax emitted), and sequences that end
    once a block emitted ``end`` or they generated ``max_tokens`` tokens (the records
    then hold ``live``, and later blocks count -1 accepted), or once ``done_of(its
    generated token ids)`` holds after a block (a task's stop strings: the block's
    tokens then come to the host every block). With ``history`` the
    decoded token ids of each sequence (its prompt and what it generated) come back
    as a last value. ``tick()``, when given, is called after each batch.

    All uniforms of a prompt are drawn from its generator up front: draft (blocks, g),
    accept (blocks, g), resample/bonus (blocks,). ``rule=None`` is the standard rule
    (the trace recorder); otherwise ``rule`` (``many(features) -> thresholds``)
    decides drafts among the draft's top-k tokens and the standard rule the others,
    as in ``evolve.data.decode``. Returns ``(columns, accepted)``: the v1 + v2 + v3
    columns of every drafted position (None unless ``record``; not with a rule) and
    the accepted draft count of every block, int64 (n, blocks). With ``track`` (and a
    rule), a third value: the exact TV and KL of the emitted token at every drafted
    position the rule reached (``evolve.data.emission``; with its ``sequence``,
    ``block`` and ``block_position``), and ``history``, each sequence's decoded
    token ids. ``progress(drafted)``, if given, is called after every block with the
    number of positions it drafted."""
    cfg = pair.config
    g, k, C, batch = cfg.block_size, cfg.top_k, cfg.context_len, cfg.batch_size
    if rule is not None and record:
        raise ValueError("hf decode: traces are recorded with the standard rule only")
    if track and rule is None:
        raise ValueError("hf decode: tracking the distortion needs a rule")
    n = len(prompts)
    if max_tokens is None:
        check_lengths(pair, prompts, blocks)
    else:       # a budget ends every sequence first (the last block may pass it by g)
        check_fits(pair, max((len(p) for p in prompts), default=0) + max_tokens - 1 + g, 0)
    U = (np.stack([r.random((blocks, 2 * g + 1)) for r in rngs]) if n
         else np.zeros((0, blocks, 2 * g + 1)))
    stop = (greedy, end, max_tokens, done_of)
    parts, accepted, tracked, hists = [], [], [], []
    for s0 in range(0, n, batch):
        cols, n_acc, tr, h = _decode_batch(pair, prompts[s0:s0 + batch], U[s0:s0 + batch],
                                           blocks, g, k, C, s0, record, rule, track, progress,
                                           stop)
        parts.append(cols)
        accepted.append(n_acc)
        tracked.append(tr)
        hists += h
        if tick is not None:
            tick()
    cols = ({f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
            if record and parts else None)
    acc = np.concatenate(accepted) if accepted else np.zeros((0, blocks), dtype=np.int64)
    if history:
        return cols, acc, hists
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


def _texts_acceptance(rule, task, texts, X, P, Q, gen_before, live, std, greedy: bool):
    """Acceptance probabilities (B, g) of a block's drafts under a rule that decides whole
    blocks from the texts (``block_acceptance``, the answer oracle, ``evolve.rules.oracle``),
    asked for the live sequences only, with the task pair ``task`` (its continuations,
    answers and ends); an ended sequence gets the lossless rule's (it emits nothing)."""
    import torch  # lazy: the core install has no torch
    B, g = X.shape
    if greedy:
        base = (X == P.argmax(dim=2)).to(torch.float64)
    else:
        base = std
    idx = np.flatnonzero(live.cpu().numpy())
    if idx.size == 0:
        return base
    Xh = X.cpu().numpy()[idx]
    width = max(len(texts[i]) for i in idx) + g
    ctxs = np.full((idx.size, g, width), task.pad, dtype=np.int64)
    for r, i in enumerate(idx):
        for j in range(g):
            h = texts[i] + Xh[r, :j].tolist()
            ctxs[r, j, width - len(h):] = h
    a = rule.block_acceptance(task, ctxs, Xh, P[idx].cpu().numpy(), Q[idx].cpu().numpy(),
                              gen_before.cpu().numpy()[idx], greedy)
    out = base.clone()
    out[torch.as_tensor(idx, device=out.device)] = torch.as_tensor(a, dtype=out.dtype,
                                                                   device=out.device)
    return out


def _decode_batch(pair, prompts, U, blocks, g, k, C, seq0, record, rule, track, progress,
                  stop=(False, None, None, None)):
    import torch  # lazy: the core install has no torch
    greedy, end, max_tokens, done_of = stop
    stops = end is not None or max_tokens is not None or done_of is not None
    made = [[] for _ in prompts]        # generated tokens, kept on the host for done_of
    B, V, temp, dev = len(prompts), pair.vocab, pair.config.temperature, pair.device
    hist = [np.asarray(p, dtype=np.int64) for p in prompts]
    lay = Layout(hist, blocks, g, dev)
    draft, target = Cached(pair.draft), Cached(pair.target)
    Ut = torch.from_numpy(np.ascontiguousarray(U)).to(dev)
    npos0 = lay.npos.clone()
    rows = torch.arange(B, device=dev)
    kind = residual_kind(rule)
    classes = None if rule is None else VC.of_pair(pair)     # the token_class input's
    classes = None if classes is None else torch.as_tensor(classes, dtype=torch.float64,
                                                           device=dev)
    rec: dict[str, list] = {}
    drafts, counts, news = [], [], []
    tr: dict[str, list] = {f: [] for f in TRACKED}
    if greedy and kind != "standard":
        raise ValueError(f"rule {getattr(rule, 'name', rule)!r}: greedy decoding takes rules "
                         "with the standard residual (the correction is the target's argmax)")
    done = torch.zeros(B, dtype=torch.bool, device=dev)     # the sequence has ended
    mism = torch.zeros(B, dtype=torch.float64, device=dev)  # accepted mismatches so far
    ran = 0                 # blocks decoded (fewer once every sequence has ended)
    texts = None            # a rule deciding whole blocks reads each sequence's text
    if getattr(rule, "decides_blocks", False):
        if getattr(pair, "task", None) is None:
            raise ValueError(f"rule {getattr(rule, 'name', rule)!r} reads the texts of a "
                             "task; this pair has no task")
        texts = [h.tolist() for h in hist]
    with torch.no_grad():
        draft.prefill(lay)
        target.prefill(lay)
        for t in range(blocks):
            if stops and bool(done.all()):
                break
            ran = t + 1
            live = ~done
            gen_before = lay.npos - npos0
            lay.open_block()
            Q = torch.empty((B, g, V), dtype=torch.float64, device=dev)
            for j in range(g):
                Q[:, j] = DV.probs(draft.read(lay, lay.cols, 1)[:, 0], V, temp)
                lay.append(Q[:, j].argmax(dim=1) if greedy else DV.sample(Q[:, j], Ut[:, t, j]))
            P = DV.probs(target.read(lay, lay.cols, g + 1), V, temp)
            X = lay.ids[:, lay.block_start + 1:lay.cols].clone()
            Pg, Qg = P[:, :g].reshape(B * g, V), Q.reshape(B * g, V)
            if record or rule is not None:
                F = DV.block_features(Pg, Qg, X, gen_before, k, mism, classes, record)
            else:
                x = X.reshape(-1, 1)
                F = {"draft_prob": Qg.gather(1, x)[:, 0], "target_prob": Pg.gather(1, x)[:, 0]}
            std = (F["target_prob"] / F["draft_prob"]).clamp_max(1.0).reshape(B, g)
            if texts is not None:       # a rule that reads the texts (the answer oracle)
                a = _texts_acceptance(rule, pair.task, texts, X, P[:, :g], Q, gen_before,
                                      live, std, greedy)
            elif greedy:      # matches kept, a rule judges the mismatches
                match = X == P[:, :g].argmax(dim=2)
                a = (match.to(torch.float64) if rule is None else
                     torch.where(match, 1.0, DV.rule_acceptance(rule, F, B, g)))
            else:
                a = std if rule is None else DV.rule_acceptance(rule, F, B, g)
            acc = Ut[:, t, g:2 * g] < a
            n_acc = torch.where(acc.all(dim=1), g, (~acc).to(torch.int8).argmax(dim=1))
            took = torch.arange(g, device=dev).unsqueeze(0) < n_acc.unsqueeze(1)
            mism = mism + (took & (X != P[:, :g].argmax(dim=2))).sum(dim=1).to(torch.float64)
            Pn = P[rows, n_acc]
            if greedy:      # the target's argmax (at a rejection and after the last draft)
                new = Pn.argmax(dim=1)
            else:
                rej = (n_acc < g).unsqueeze(1)
                jm = n_acc.clamp_max(g - 1)
                Qn = torch.where(rej, Q[rows, jm], 0.0)
                Rn = rejection_residual(kind, Pn, Qn, X[rows, jm])
                new = DV.sample(torch.where(rej, Rn, Pn), Ut[:, t, 2 * g])
            if track:
                _track(tr, Pg, Qg, F, gen_before, n_acc, rule, k, seq0, t, classes)
            if record:
                for f, v in F.items():
                    if f not in DV.RECORD_SKIPS:
                        rec.setdefault(f, []).append(v)
                # the schema's standard decisions (greedy too: rand < min(1, p/q))
                rec.setdefault("baseline_accepts", []).append(
                    (acc if not greedy else Ut[:, t, g:2 * g] < std).reshape(-1))
                if stops:
                    rec.setdefault("live", []).append(live.repeat_interleave(g))
            lay.settle(n_acc, new)
            if texts is not None:       # each live sequence's emitted tokens, on the host
                o = torch.cat([X, new.unsqueeze(1)], dim=1)
                o[rows, n_acc] = new
                o, n, lv = (v.cpu().numpy() for v in (o, n_acc, live))
                for i in np.flatnonzero(lv):
                    texts[i] += o[i, :n[i] + 1].tolist()
            drafts.append(X)
            news.append(new)
            if stops:       # an ended sequence emits nothing more; its blocks count -1
                counts.append(torch.where(live, n_acc, -1))
                out = torch.cat([X, new.unsqueeze(1)], dim=1)
                out[rows, n_acc] = new
                emit = (torch.arange(g + 1, device=dev).unsqueeze(0) <= n_acc.unsqueeze(1)) \
                    & live.unsqueeze(1)
                if end is not None:
                    done = done | ((out == end) & emit).any(dim=1)
                if max_tokens is not None:
                    done = done | (lay.npos - npos0 >= max_tokens)
                if done_of is not None:
                    o, n, lv, dn = (v.cpu().numpy() for v in (out, n_acc, live, done))
                    for i in np.flatnonzero(lv):
                        made[i] += o[i, :n[i] + 1].tolist()
                        if not dn[i]:
                            dn[i] = bool(done_of(made[i]))
                    done = torch.as_tensor(dn, device=dev)
            else:
                counts.append(n_acc)
            if progress is not None:
                progress(B * g)
    X_all = torch.stack(drafts).cpu().numpy() if drafts else np.zeros((0, B, g), np.int64)
    accepted = np.full((B, blocks), -1, dtype=np.int64)
    if counts:
        accepted[:, :ran] = torch.stack(counts).cpu().numpy().T
    new_all = torch.stack(news).cpu().numpy() if news else np.zeros((0, B), np.int64)
    host: dict[str, list] = {}
    if record:
        tok_dtype = np.int32 if V < 2 ** 31 else np.int64
        for f, parts in rec.items():
            a = torch.stack(parts).cpu().numpy()
            host[f] = list(a.astype(tok_dtype) if f == "cand_token" else a)
        host["rand_value"] = list(U[:, :ran, g:2 * g].transpose(1, 0, 2)
                                  .reshape(ran, B * g))
        host["sequence"] = [np.repeat(seq0 + np.arange(B), g)] * ran
        host["block_index"] = [np.full(B * g, t, dtype=np.int64) for t in range(ran)]
        host["context"] = []
    for t in range(ran):
        if record:
            host["context"].append(_contexts(hist, X_all[t], C) if C
                                   else np.zeros((B * g, 0), np.uint8))
        hist = [h if accepted[i, t] < 0 else
                np.concatenate([h, X_all[t, i, :accepted[i, t]], new_all[t, i:i + 1]])
                for i, h in enumerate(hist)]
    tracked = None
    if track:
        tracked = {f: np.concatenate(v) for f, v in tr.items()}
        tracked["history"] = hist
    return ((sequence_major(host, ran, B, g) if record else None), accepted, tracked,
            hist)


def _track(tr: dict, Pg, Qg, F, gen_before, n_acc, rule, k: int, seq0: int, t: int,
           classes=None) -> None:
    """The exact distortion of the emitted token at the block's reached positions: on
    the device (``hf_device.slot_distortion``), or, for a rule that judges every
    draft, in numpy with the reached slots' distributions brought to the host."""
    import torch  # lazy: the core install has no torch
    B = n_acc.shape[0]
    g = Pg.shape[0] // B
    j = torch.arange(g, device=Pg.device).repeat(B)
    seq = torch.arange(B, device=Pg.device).repeat_interleave(g)
    idx = torch.nonzero(j <= n_acc[seq]).squeeze(1)
    dist = DV.slot_distortion(Pg, Qg, F, idx, rule, classes)
    if dist is None:
        pos = (gen_before[seq[idx]] + j[idx]).cpu().numpy()
        ahead = {f: F[f][idx].cpu().numpy() for f in LOOKAHEAD_INPUT_NAMES if f in F}
        tv, kl = slot_distortion(Pg[idx].cpu().numpy(), Qg[idx].cpu().numpy(), pos,
                                 j[idx].cpu().numpy(), rule, k, ahead or None,
                                 None if classes is None else classes.cpu().numpy())
    else:
        tv, kl = (d.cpu().numpy() for d in dist)
    idx, j, seq = idx.cpu().numpy(), j.cpu().numpy(), seq.cpu().numpy()
    for f, v in (("sequence", seq0 + seq[idx]), ("block", np.full(idx.size, t)),
                 ("block_position", j[idx]), ("tv", tv), ("kl", kl)):
        tr[f].append(v)
