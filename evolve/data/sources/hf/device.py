"""Per-position computations of the Hugging Face decoder, on the models' device in
torch float64 (``evolve.data.sources.hf.decode`` calls them every block).

Each function is the torch form of a numpy definition in ``evolve.data.decode``
with the same semantics (the numpy one is the reference the tests compare
with): ``probs`` (softmax at the temperature, floored at the smallest normal
double), ``sample`` (``sample_rows``: inverse CDF with a pre-drawn uniform),
``entropy``, ``candidates`` (``candidate_summary``: the draft's top-k, lower id
first on ties, and the tail and tail-excess masses), ``slot_features``
(``slot_features``: the schema-v3 slot TV, both KLs and the count of q > p),
``lookahead_features`` (``lookahead_features``: the same operations in the same
order, so the same slot TVs give the same bits),
``rejection_residual`` (``rejection_residual``, with ``RESIDUAL_EPS``) and
``slot_distortion`` (``evolve.data.emission.slot_distortion``). Sums may
differ from numpy's in their last bits (another summation order); on one device
they are deterministic.

torch is imported inside functions: the core install does not need it.
"""

from __future__ import annotations

import numpy as np

from evolve.data.decode import (KL_FLOOR, RESIDUAL_EPS, SORT_ALL_MAX_VOCAB, STANDARD,
                                clipped, judges_every_draft, residual_kind)
from evolve.data.inputs import AT_SLOTS, Ops, Slots, at_slots
from evolve.data.traces import V4_ALL_FIELDS
from evolve.lang.features import ALL_INPUT_NAMES, LOOKAHEAD_INPUT_NAMES, TOKEN_LEVEL

PROB_FLOOR = float(np.finfo(np.float64).tiny)


def probs(logits, vocab: int, temperature: float):
    """softmax(logits[..., :vocab] / temperature) in float64, floored at PROB_FLOOR."""
    import torch  # lazy: the core install has no torch
    x = logits[..., :vocab].to(torch.float64) / temperature
    return torch.softmax(x, dim=-1).clamp_min_(PROB_FLOOR)


def sample(P, u):
    """One index per row of a non-negative (M, V) matrix by inverse CDF with the
    uniforms u (M,): the number of CDF entries <= u * total, at most the last index
    with mass (``evolve.data.decode.sample_rows``)."""
    import torch  # lazy: the core install has no torch
    cdf = torch.cumsum(P, dim=1)
    thr = (u * cdf[:, -1]).unsqueeze(1)
    x = torch.searchsorted(cdf, thr, right=True).squeeze(1)
    ids = torch.arange(P.shape[1], device=P.device)
    last = torch.where(P > 0, ids, -1).amax(dim=1)
    return torch.minimum(x, last)


def entropy(P):
    """Entropy in nats of each row (rows of a floored softmax have no zeros)."""
    import torch  # lazy: the core install has no torch
    t = torch.where(P > 0, P * torch.log(torch.where(P > 0, P, 1.0)), 0.0)
    return (-t.sum(dim=-1)).clamp_min(0.0)


def _kl(a, b):
    import torch  # lazy: the core install has no torch
    pos = a > 0
    t = a * (torch.log(torch.where(pos, a, 1.0)) - torch.log(b.clamp_min(KL_FLOOR)))
    return torch.where(pos, t, 0.0).sum(dim=-1)


def slot_features(p, q) -> dict:
    """The schema-v3 slot features of each row of the full distributions p, q."""
    import torch  # lazy: the core install has no torch
    return {"slot_tv": (q - p).clamp_min(0.0).sum(dim=-1),
            "slot_kl_pq": _kl(p, q), "slot_kl_qp": _kl(q, p),
            "slot_n_q_gt_p": (q > p).sum(dim=-1).to(torch.int64)}


def lookahead_features(slot_tv, g: int) -> dict:
    """The lookahead inputs of rows in block order (g per block) from their slot TVs:
    ``evolve.data.decode.lookahead_features`` step by step in float64 (next_tv the
    next slot's TV, 0 at the last; ahead_j = (1 - TV_(j+1)) (1 + ahead_(j+1)) from
    the block's end), so it gives the same bits for the same slot TVs."""
    import torch  # lazy: the core install has no torch
    tv = slot_tv.to(torch.float64).reshape(-1, g)
    nxt = torch.zeros_like(tv)
    nxt[:, :-1] = tv[:, 1:]
    ahead = torch.zeros_like(tv)
    for j in range(g - 2, -1, -1):
        ahead[:, j] = (1.0 - tv[:, j + 1]) * (1.0 + ahead[:, j + 1])
    return {"next_tv": nxt.reshape(-1), "ahead": ahead.reshape(-1)}


def _take(P, x):
    return P.gather(1, x.unsqueeze(1)).squeeze(1) if x.dim() == 1 else P.gather(1, x)


def _vocab(V, P):
    import torch  # lazy: the core install has no torch
    return torch.arange(V, device=P.device).unsqueeze(0)


def matches_ahead(match, g: int):
    """``evolve.data.inputs.matches_ahead`` step by step in float64 (the same bits)."""
    import torch  # lazy: the core install has no torch
    m = match.to(torch.float64).reshape(-1, g)
    out = torch.zeros_like(m)
    for j in range(g - 2, -1, -1):
        out[:, j] = m[:, j + 1] * (1.0 + out[:, j + 1])
    return out.reshape(-1)


def count_before(flag, g: int):
    """``evolve.data.inputs.count_before`` step by step in float64 (the same bits)."""
    import torch  # lazy: the core install has no torch
    f = flag.to(torch.float64).reshape(-1, g)
    out = torch.zeros_like(f)
    for j in range(1, g):
        out[:, j] = out[:, j - 1] + f[:, j - 1]
    return out.reshape(-1)


def _log(a):
    import torch  # lazy: the core install has no torch
    return torch.log(a)


# The torch functions the inputs are computed with (``evolve.data.inputs``)
def ranks(P, values):
    """``evolve.data.inputs.ranks`` on the device: how many entries of each row of P
    are above each of its values (M,) or (M, T), int64. Counted one value column at a
    time, the same integers as sorting each row and searching it: a count costs one
    pass over the vocabulary, a sort about log2 of it (``benchmarks/speed/ranks.py``)."""
    import torch  # lazy: the core install has no torch
    one = values.dim() == 1
    v = (values.unsqueeze(1) if one else values).to(P.dtype)
    out = torch.stack([(P > v[:, t:t + 1]).sum(dim=1) for t in range(v.shape[1])], dim=1)
    return out[:, 0] if one else out


OPS = Ops(_take, lambda v, shape: v if len(shape) == 1 else v.unsqueeze(1).expand(*shape),
          entropy, lambda P: P.argmax(dim=1), lambda P: P.amax(dim=1), slot_features,
          lookahead_features, _vocab, matches_ahead, count_before, _log,
          lambda P, v: ranks(P, v).to(P.dtype))


def top_candidates(q, k: int):
    """Ids of the k largest entries of each row, descending, lower id first on ties;
    above ``SORT_ALL_MAX_VOCAB`` ids from ``torch.topk``, then ordered the same way
    (which of several ids tied at the k-th value is kept is then deterministic, not
    necessarily the lowest, as in ``evolve.data.decode.top_candidates``)."""
    import torch  # lazy: the core install has no torch
    V = q.shape[1]
    if V <= SORT_ALL_MAX_VOCAB or k >= V:
        return torch.sort(q, dim=1, descending=True, stable=True).indices[:, :k]
    part = torch.topk(q, k, dim=1, sorted=False).indices
    part = torch.sort(part, dim=1).values                        # ids ascending, then
    vals = torch.gather(q, 1, part)                              # values descending (stable)
    return torch.gather(part, 1, torch.sort(vals, dim=1, descending=True, stable=True).indices)


def candidates(p, q, k: int) -> dict:
    """``candidate_summary`` on the device: top-k of q with both probabilities, and the
    tail and tail-excess masses (cand_token as int64; the caller narrows it)."""
    import torch  # lazy: the core install has no torch
    order = top_candidates(q, k)
    tail = torch.ones_like(q, dtype=torch.bool).scatter_(1, order, False)
    plus = tail & (p > q)
    cp = torch.gather(p, 1, order)
    return {"cand_token": order,
            "cand_draft_prob": torch.gather(q, 1, order),
            "cand_target_prob": cp,
            "tail_draft_prob": torch.where(tail, q, 0.0).sum(dim=1),
            "tail_target_prob": torch.where(tail, p, 0.0).sum(dim=1),
            "tail_excess_draft_prob": torch.where(plus, q, 0.0).sum(dim=1),
            "tail_excess_target_prob": torch.where(plus, p, 0.0).sum(dim=1)}


def rejection_residual(kind: str, p, q, x):
    """The unnormalised distribution after a rejection of the drafts x (one per row):
    max(0, p - q) for the standard kind, p with x removed for the target-only one;
    rows of mass < RESIDUAL_EPS fall back to p (``evolve.data.decode``)."""
    import torch  # lazy: the core install has no torch
    if kind == STANDARD:
        r = (p - q).clamp_min(0.0)
    else:
        r = p.clone()
        r[torch.arange(r.shape[0], device=r.device), x] = 0.0
    small = r.sum(dim=1) < RESIDUAL_EPS
    return torch.where(small.unsqueeze(1), p, r)


def block_features(Pg, Qg, X, gen_before, k: int, mismatches=None, classes=None,
                   record: bool = True) -> dict:
    """Every per-row quantity of a block's B g drafted positions (Pg, Qg: (B g, V);
    X: (B, g) drafts; gen_before: (B,) tokens generated before the block): what the
    recorder stores and what a rule reads (every input, ``evolve.data.inputs``), all
    on the device; ``mismatches`` (B,): each sequence's accepted mismatches before the
    block (the ``mismatches`` input, where given); ``classes`` (V,) the vocabulary's
    token classes on the device (the ``token_class`` input, where given). The inputs a
    trace derives from its
    columns (the lookahead, answer and verify groups, along the drafted tokens) are for
    rules only: the recorder leaves them out (``RECORD_SKIPS``). ``record=False`` leaves
    out what only a trace records, the candidates' ranks (a pass over the vocabulary per
    candidate)."""
    import torch  # lazy: the core install has no torch
    B, g = X.shape
    x = X.reshape(-1)
    dev = Pg.device
    top = Pg.argmax(dim=1)
    cs = candidates(Pg, Qg, k)
    hit = cs["cand_token"] == x.unsqueeze(1)
    jj = torch.arange(g, device=dev)
    s = Slots(Pg, Qg, x, (gen_before.unsqueeze(1) + jj.unsqueeze(0)).reshape(-1),
              jj.repeat(B), g=g, ops=OPS, history=None if mismatches is None else
              {"mismatches": mismatches.to(torch.float64).repeat_interleave(g)},
              classes=classes)
    feats = at_slots(s)
    feats["target_rank"] = feats["target_rank"].to(torch.int32)     # recorded as int32
    if record:
        cs["cand_target_rank"] = ranks(Pg, cs["cand_target_prob"]).to(torch.int32)
    return {**feats, "token": x,
            "draft_cand": torch.where(hit.any(dim=1), hit.to(torch.int8).argmax(dim=1), -1),
            "target_top": top, **cs, **s.slots}


# the inputs a trace derives from its columns (block_features a trace does not record)
RECORD_SKIPS = tuple(n for n in ALL_INPUT_NAMES if n not in V4_ALL_FIELDS)


def rule_acceptance(rule, F: dict, B: int, g: int):
    """Acceptance probabilities (B, g) of a block's drafts under ``rule`` (a numpy
    ``many(features)`` rule), as ``evolve.data.decode.drafted_acceptance`` decides:
    the rule's clipped threshold for drafts among the draft's top-k, the standard rule
    for the others (an engine's knob: the rule for every draft). Only the B g rows
    of inputs go to the host and the B g thresholds come back."""
    import torch  # lazy: the core install has no torch
    host = {f: F[f].cpu().numpy() for f in ALL_INPUT_NAMES if f in F}
    a = torch.from_numpy(np.ascontiguousarray(clipped(rule.many(host)))).to(F["draft_prob"].device)
    if not judges_every_draft(rule):
        std = (F["target_prob"] / F["draft_prob"]).clamp_max(1.0)
        a = torch.where(F["draft_cand"] >= 0, a, std)
    return a.reshape(B, g)


def slot_distortion(Pg, Qg, F: dict, idx, rule, classes=None):
    """(TV, KL) of the emitted token at the rows ``idx`` of a block under ``rule``, on
    the device, as ``evolve.data.emission.slot_distortion`` computes them: the rule
    decides the draft's top-k candidates (their M k rows of features go to the host,
    their thresholds come back), the standard rule every other token, the standard
    residual after a rejection. None for a rule that judges every draft, or reads an
    input not computed here (the caller then takes the numpy path)."""
    import torch  # lazy: the core install has no torch
    if judges_every_draft(rule) or residual_kind(rule) != STANDARD:
        return None
    p, q, cand = Pg[idx], Qg[idx], F["cand_token"][idx]
    M, k = cand.shape
    at_cand = Slots(p, q, cand, None, None, ops=OPS, classes=classes)  # the token's own
    host = {}
    for name in ALL_INPUT_NAMES:
        if name in TOKEN_LEVEL and not at_cand.has(name):
            continue                     # the token class, without the vocabulary's
        if name in TOKEN_LEVEL:
            v = AT_SLOTS[name](at_cand)
        elif name in F and F[name].dim() == 1:
            v = F[name][idx].unsqueeze(1).expand(M, k)
        else:
            continue                     # not computed here (an input of another world)
        host[name] = v.reshape(-1).cpu().numpy()
    if {n.name for n in getattr(rule, "nodes", ()) if n.kind == "input"} - set(host) or \
            getattr(rule, "nodes", None) is None and len(host) < len(ALL_INPUT_NAMES):
        return None                      # the rule may read one: the numpy path decides
    a_c = torch.from_numpy(np.ascontiguousarray(clipped(rule.many(host)))).to(p.device)
    a = (p / q).clamp_max(1.0).scatter_(1, cand, a_c.reshape(M, k))
    beta = (q * a).sum(dim=1, keepdim=True)
    r = rejection_residual(STANDARD, p, q, None)
    out = q * a + (1.0 - beta) * (r / r.sum(dim=1, keepdim=True))
    tv = 0.5 * (out - p).abs().sum(dim=1)
    kl = torch.where(out > 0, out * torch.log(torch.where(out > 0, out, 1.0) / p), 0.0)
    return tv, kl.sum(dim=1).clamp_min(0.0)
