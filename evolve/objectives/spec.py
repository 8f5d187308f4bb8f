"""Exact speculative-decoding objectives of an acceptance rule, from v2 traces.

A rule gives a threshold ``h`` for every candidate row (a drafted position of a
trace and one of the draft's top-k bytes ``x`` there); its acceptance
probability is ``a(x) = clip(h, 0, 1)`` (NaN -> 0, as in ``evolve.objectives.metrics``).

Decoder (the algorithm whose numbers these are; ``evolve.freerun.simulate`` runs the same):
draft ``x ~ q``; accept with ``a(x)`` if ``x`` is one of the draft's top-k bytes at
that position, else with the standard ``min(1, p(x)/q(x))`` (the "top-k
restricted" rule; with k = 256 there is no tail); on rejection resample from
``r = norm(max(0, p - q))`` (from ``p`` itself where that residual has mass
< ``RESIDUAL_EPS``, i.e. p == q). The emitted byte at a position is then
distributed as

    out(x) = q(x) a(x) + (1 - beta) r(x),      beta = sum_x q(x) a(x),

computed exactly (no assumption that a(x) >= min(1, p/q)). Tail bytes (outside
the top-k) split into T+ = {p > q} and T- = {p <= q}; with the standard rule
there, out = p on T- and out = q + s (p - q) on T+ (s = (1 - beta) / Z), so the
tail's contribution to TV is exact from the four stored tail masses. For KL the
tail enters as two merged bins (T+, T-): exact when s = 1 or |T+| <= 1, and a
lower bound otherwise (log-sum inequality); with k = 256 KL is exact.

Two engines' knobs (``evolve.rules.table``, docs/export.md) judge every draft and
are scored here, not by the kernel: transformers' ensemble weight w keeps a tail
draft with min(1, 1 - w + w p/q) (``tail_weight``; still exact in TV, the tail's
sign is fixed on T+ and T-), and SGLang's target-only rules resample from p
without the rejected draft (``residual="target_without_draft"``), exact on
traces whose candidates hold all of the draft's mass.

Per drafted position (row) i:
    alpha_i = beta_i            expected acceptance given the position is reached
    tv_i    = TV(out_i, p_i)    = 1/2 sum_x |out_i(x) - p_i(x)|
    kl_i    = KL(out_i || p_i)  = sum_x out_i(x) log(out_i(x) / p_i(x))
    a_x,i   = the acceptance probability of the recorded draft x_i

Per block b (rows b g .. b g + g - 1, recorded drafts x_1..x_g), with reach
weights W_1 = 1, W_{j+1} = W_j a_x,j (an unbiased estimate of P(reach j+1)):

    tokens_b = 1 + sum_j W_j alpha_j      (Rao-Blackwellised expected tokens per
                                           target call: accepted drafts + 1)
    tv_b     = sum_j W_j tv_j             (expected summed TV of the emitted bytes;
                                           the bonus byte comes from p: TV 0)

Over the split (blocks weighted equally; their start contexts come from the
standard rule's trajectory):

    tokens_per_call = mean_b tokens_b                (standard error over blocks)
    tv_per_token    = sum_b tv_b / sum_b tokens_b    (mean TV per emitted byte)
    kl_per_token    = the same with kl
    acceptance_j    = sum_b W_bj alpha_bj / sum_b W_bj   (per block position;
                                                         0 if never reached)
    gain(c)         = tokens_per_call / (g c + 1)    (wall-time speed-up for a
                      draft/target cost ratio c; (1 - a^(g+1)) / ((1 - a)(g c + 1))
                      when every alpha is a)

``X`` has one row per input in ``FEATURES`` order (opcode = row index, as
``evolve.kernels.interpreter.run_program`` reads it): for candidate x, draft_prob =
q(x), target_prob = p(x), top_token_match = 1.0 iff x is the target's argmax; the
others (9..11: slot features, where ``evolve.data.decode.slot_columns`` finds them)
are the drafted position's, equal for every candidate: the sums stay exact. Rows
12..13 (with the slot features) are the lookahead inputs
(``evolve.data.decode.lookahead_features``) along the recorded drafts: equal for
every candidate here too, but in decoding they follow the token drafted at the
slot, so for a rule that reads them these sums are an estimate (the recorded
draft's later slots stand in for every candidate's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from evolve.data import inputs
from evolve.data.decode import RESIDUAL_EPS, slots_missing
from evolve.data import distance
from evolve.errors import EvolveError
from evolve.kernels import layout
from evolve.lang.features import ALL_INPUT_NAMES, names_of
from evolve.objectives.metrics import clip01

GROUPS = ("token", "trace", "slot", "lookahead", "rank", "vocab")   # the trace world offers
FEATURES = names_of(*GROUPS)      # the rows of a trace split's input matrix, in opcode order
N_FEATURES = len(FEATURES)
TAIL_SHARE = 0.01        # --cap-tv-p99 C: at most this share of the reach has slot TV > C


@dataclass
class TraceArrays:
    """A v2 split prepared once for the objectives (numpy reference and kernel)."""
    g: int
    k: int
    n: int                 # drafted positions (rows)
    X: np.ndarray          # (9, n*k) float64, C-contiguous: candidate features
    cq: np.ndarray         # (n*k,) q of each candidate
    cp: np.ndarray         # (n*k,) p of each candidate
    tq: np.ndarray         # (n,) q(T)
    tp: np.ndarray         # (n,) p(T)
    eq: np.ndarray         # (n,) q(T+)
    ep: np.ndarray         # (n,) p(T+)
    dcand: np.ndarray      # (n,) int64 column of the drafted byte, -1 in the tail
    std_x: np.ndarray      # (n,) min(1, p(x)/q(x)) of the drafted byte
    missing: str = ""      # why X has no slot-feature rows ("" when it has them)

    @property
    def n_blocks(self) -> int:
        return self.n // self.g

    @classmethod
    def from_split(cls, ts) -> "TraceArrays":
        c = ts.columns
        n, k = c["cand_token"].shape
        g = int(ts.meta["block_size"])
        return cls(g, k, n, candidate_matrix(ts),
                   np.ascontiguousarray(c["cand_draft_prob"], dtype=np.float64).reshape(-1),
                   np.ascontiguousarray(c["cand_target_prob"], dtype=np.float64).reshape(-1),
                   *(np.ascontiguousarray(c[f], dtype=np.float64) for f in
                     ("tail_draft_prob", "tail_target_prob", "tail_excess_draft_prob",
                      "tail_excess_target_prob")),
                   np.ascontiguousarray(c["draft_cand"], dtype=np.int64),
                   np.minimum(1.0, c["target_prob"] / c["draft_prob"]),
                   slots_missing(c, ts.meta.get("source", "<traces>")))

    def blocks(self, idx) -> "TraceArrays":
        """The rows of the blocks ``idx`` (sorted block numbers), as a new TraceArrays."""
        idx = np.asarray(idx, dtype=np.int64)
        rows = (idx[:, None] * self.g + np.arange(self.g)).reshape(-1)
        cand = (rows[:, None] * self.k + np.arange(self.k)).reshape(-1)
        return TraceArrays(self.g, self.k, rows.size, np.ascontiguousarray(self.X[:, cand]),
                          *(np.ascontiguousarray(a[cand]) for a in (self.cq, self.cp)),
                          *(np.ascontiguousarray(a[rows]) for a in
                            (self.tq, self.tp, self.eq, self.ep, self.dcand, self.std_x)),
                          self.missing)

    def features(self) -> dict:
        """Feature name -> (n, k) view of X."""
        return {f: self.X[i].reshape(self.n, self.k)
                for i, f in enumerate(ALL_INPUT_NAMES[:len(self.X)]) if f in FEATURES}


def candidate_matrix(ts) -> np.ndarray:
    """The (14 or 9, N*k) float64 input matrix of a split's candidates, one row per
    input in the registry's order (``evolve.data.inputs.input_matrix``)."""
    return inputs.input_matrix(inputs.readable(ts.columns, ts.meta), "candidates", GROUPS)



# ------------------------------------------------------- per-position terms

@dataclass
class PositionTerms:
    alpha: np.ndarray      # (n,) expected acceptance at the position
    a_x: np.ndarray        # (n,) acceptance probability of the recorded draft
    tv: np.ndarray         # (n,)
    kl: np.ndarray         # (n,)
    extra: np.ndarray      # (n,) sum_x q(x) (a(x) - min(1, p/q)): extra acceptance mass
    out: np.ndarray        # (n, k) output probability of each candidate
    out_tail: np.ndarray   # (n, 2) output mass of the tail bins T+, T-


def _xlogy_ratio(o, p):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(o > 0.0, o * np.log(o / p), 0.0)


class TailError(EvolveError):
    """A target-only rule on a split whose candidates miss some of the draft's mass."""


def check_full_candidates(sa: TraceArrays) -> None:
    """TailError unless the candidates hold all of the draft's mass at every row (q(T)
    = 0, as with top-k = vocabulary): what the target-only residual needs."""
    if sa.n and float(sa.tq.max()) > 0.0:
        raise TailError(f"a target-only rule (resampling from p without the draft) is exact "
                        f"only on traces whose candidates hold all of the draft's mass; "
                        f"these have top-k {sa.k} and a draft tail mass up to "
                        f"{float(sa.tq.max()):.3g} (record with --top-k = the vocabulary)")


def position_terms(sa: TraceArrays, h, residual: str = "standard",
                   tail_weight: float = 1.0) -> PositionTerms:
    """Exact per-position acceptance, output distribution, TV and KL (numpy reference).

    ``residual="target_without_draft"``: the rule's draft is kept with a(x) and a
    rejection resamples from p without x (SGLang's target-only verification;
    ``evolve.data.emission``); exact where q(T) = 0 (``check_full_candidates``).

    ``tail_weight`` w: the tail's drafts are kept with min(1, 1 - w + w p/q)
    (transformers' ensemble weight, which judges every draft) instead of the
    standard min(1, p/q) (w = 1). On T+ that is 1, on T- it is (1 - w) q + w p, so the
    tail's acceptance mass is q(T+) + (1 - w) q(T-) + w p(T-) and its emitted mass
    on T- is (1 - w) q + w p + s r: out - p has one sign on each bin, so TV stays
    exact (KL: the merged-bin bound above)."""
    n, k = sa.n, sa.k
    a = clip01(np.broadcast_to(np.asarray(h, dtype=np.float64), (n * k,))).reshape(n, k)
    cq = sa.cq.reshape(n, k)
    cp = sa.cp.reshape(n, k)
    if residual == "target_without_draft":
        return _without_draft_terms(sa, a, cq, cp)
    if residual != "standard":
        raise ValueError(f"unknown residual {residual!r}")
    tq, tp, eq, ep = sa.tq, sa.tp, sa.eq, sa.ep
    std = np.minimum(1.0, cp / cq)
    rplus = np.maximum(cp - cq, 0.0)
    Z = rplus.sum(axis=1) + (ep - eq)
    fb = Z < RESIDUAL_EPS
    w = float(tail_weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"tail_weight {w!r}: expected 0 <= w <= 1")
    acc_tm = (1.0 - w) * (tq - eq) + w * (tp - ep)  # tail T-: q min(1, 1 - w + w p/q)
    m_tail = eq + acc_tm                          # w = 1: sum over T of min(p, q)
    alpha = (cq * a).sum(axis=1) + m_tail
    rho = (cq * (1.0 - a)).sum(axis=1) + (tq - m_tail)
    rc = np.where(fb[:, None], cp, rplus)
    r_tp = np.where(fb, ep, ep - eq)
    r_tm = np.where(fb, tp - ep, 0.0)
    Zr = np.where(fb, cp.sum(axis=1) + tp, Z)
    s = rho / Zr
    out = cq * a + s[:, None] * rc
    o_tp = eq + s * r_tp
    o_tm = acc_tm + s * r_tm
    tv = 0.5 * (np.abs(out - cp).sum(axis=1) + np.abs(o_tp - ep) + np.abs(o_tm - (tp - ep)))
    kl = (_xlogy_ratio(out, cp).sum(axis=1) + _xlogy_ratio(o_tp, ep)
          + _xlogy_ratio(o_tm, tp - ep))
    extra = (cq * (a - std)).sum(axis=1) + (acc_tm - (tp - ep))
    rows = np.arange(n)
    a_x = np.where(sa.dcand >= 0, a[rows, np.maximum(sa.dcand, 0)],
                   1.0 - w + w * sa.std_x)
    return PositionTerms(alpha, a_x, tv, np.maximum(kl, 0.0), extra, out,
                         np.stack([o_tp, o_tm], axis=1))


def _without_draft_terms(sa: TraceArrays, a, cq, cp) -> PositionTerms:
    """Position terms of a target-only rule (q(T) = 0: every draft is a candidate). The
    tail tokens are never drafted and are emitted with S p(y) (S below), so the tail
    bins T+ and T- are exact in TV and KL."""
    check_full_candidates(sa)
    n = sa.n
    w = cq * (1.0 - a)
    rest = 1.0 - cp
    normal = rest >= RESIDUAL_EPS
    own = np.where(normal, w / np.where(normal, rest, 1.0), 0.0)
    S = (own + np.where(normal, 0.0, w)).sum(axis=1)
    out = cq * a + cp * S[:, None] - own * cp
    ep, tpm = sa.ep, sa.tp - sa.ep
    o_tp, o_tm = S * ep, S * tpm
    tv = 0.5 * (np.abs(out - cp).sum(axis=1) + np.abs(o_tp - ep) + np.abs(o_tm - tpm))
    kl = (_xlogy_ratio(out, cp).sum(axis=1) + _xlogy_ratio(o_tp, ep)
          + _xlogy_ratio(o_tm, tpm))
    std = np.minimum(1.0, cp / cq)
    rows = np.arange(n)
    a_x = np.where(sa.dcand >= 0, a[rows, np.maximum(sa.dcand, 0)], 0.0)
    return PositionTerms((cq * a).sum(axis=1), a_x, tv, np.maximum(kl, 0.0),
                         (cq * (a - std)).sum(axis=1), out, np.stack([o_tp, o_tm], axis=1))


# --------------------------------------------------------------- objectives

@dataclass(frozen=True)
class Objectives:
    block_size: int
    n_blocks: int
    tokens_per_call: float
    tokens_se: float
    tv_per_token: float
    kl_per_token: float
    extra_per_token: float           # extra acceptance mass per emitted byte
    acceptance: tuple                # per block position
    reach: tuple                     # mean reach weight per block position
    tv_by_position: tuple = ()       # mean slot TV per block position, given it is reached
    tv_p99: float | None = None      # 99th percentile of slot TV over reached slots
                                     # (weighted by reach; numpy reference only)

    def gain(self, cost_ratio: float) -> float:
        """Wall-time speed-up over plain target decoding for draft/target cost ratio c."""
        return self.tokens_per_call / (self.block_size * cost_ratio + 1.0)

    @property
    def accept_rate(self) -> float:
        """Expected accepted drafts per block / g."""
        return (self.tokens_per_call - 1.0) / self.block_size

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance"] = list(self.acceptance)
        d["reach"] = list(self.reach)
        d["tv_by_position"] = list(self.tv_by_position)
        return d


def block_sums(sa: TraceArrays, terms: PositionTerms) -> dict:
    """Per-block Rao-Blackwellised sums: tokens, tv, kl, extra (nb,), W (nb, g)."""
    g, nb = sa.g, sa.n_blocks
    ax = terms.a_x.reshape(nb, g)
    W = np.ones((nb, g))
    if g > 1:
        W[:, 1:] = np.cumprod(ax[:, :-1], axis=1)
    al = terms.alpha.reshape(nb, g)
    return {"W": W, "alpha": al,
            "tokens": 1.0 + (W * al).sum(axis=1),
            "tv": (W * terms.tv.reshape(nb, g)).sum(axis=1),
            "kl": (W * terms.kl.reshape(nb, g)).sum(axis=1),
            "extra": (W * terms.extra.reshape(nb, g)).sum(axis=1)}


def objectives(sa: TraceArrays, h, residual: str = "standard",
               tail_weight: float = 1.0) -> Objectives:
    """All objectives of the thresholds ``h`` (n*k candidate rows) on a split (with
    ``residual`` and ``tail_weight``, see ``position_terms``)."""
    return objectives_from_terms(sa, position_terms(sa, h, residual, tail_weight))


def objectives_from_terms(sa: TraceArrays, terms: PositionTerms) -> Objectives:
    b = block_sums(sa, terms)
    nb = sa.n_blocks
    tok = b["tokens"]
    tot = tok.sum()
    den = b["W"].sum(axis=0)
    return Objectives(
        block_size=sa.g, n_blocks=nb,
        tokens_per_call=float(tok.mean()),
        tokens_se=float(tok.std(ddof=1) / np.sqrt(nb)) if nb > 1 else float("nan"),
        tv_per_token=float(b["tv"].sum() / tot),
        kl_per_token=float(b["kl"].sum() / tot),
        extra_per_token=float(b["extra"].sum() / tot),
        acceptance=_ratio((b["W"] * b["alpha"]).sum(axis=0), den),
        reach=tuple(float(x) for x in den / nb),
        tv_by_position=_ratio((b["W"] * terms.tv.reshape(nb, sa.g)).sum(axis=0), den),
        tv_p99=weighted_quantile(terms.tv, b["W"].reshape(-1), 0.99))


def _reach_by_distance(sa: TraceArrays, h):
    """Each slot's reach W and TV under thresholds ``h`` on the recorded path, and its
    distance from the prompt (0: the first token after it), (n,) each."""
    terms = position_terms(sa, h)
    W = block_sums(sa, terms)["W"].reshape(-1)
    return W, terms.tv, sa.X[names_of("token").index("position")].reshape(sa.n, sa.k)[:, 0]


def tv_by_distance(sa: TraceArrays, h) -> dict:
    """Where a rule (thresholds ``h``) puts its distortion on the recorded path: per bin
    of distance from the prompt (``evolve.data.distance``; 0 is the first token after
    the prompt), the mean slot TV of the reached slots (weighted by reach, as
    ``tv_by_position`` is by block position; None where no slot falls) and the slots."""
    W, tv, d = _reach_by_distance(sa, h)
    out = {}
    for label, m in distance.bins(d):
        w = W[m].sum()
        out[label] = {"tv": float((W[m] * tv[m]).sum() / w) if w > 0 else None,
                      "slots": int(m.sum())}
    return out


def tv_first(sa: TraceArrays, h, k_max: int) -> list:
    """The mean slot TV (reach-weighted, on the recorded path) over the first k tokens
    after the prompt, for k = 1 .. ``k_max`` (0 where no such slot is reached): what
    ``--cap-tv-first`` caps (numpy reference)."""
    W, tv, d = _reach_by_distance(sa, h)
    num = np.bincount(np.minimum(d, k_max).astype(np.int64), weights=W * tv,
                      minlength=k_max + 1)[:k_max].cumsum()
    den = np.bincount(np.minimum(d, k_max).astype(np.int64), weights=W,
                      minlength=k_max + 1)[:k_max].cumsum()
    return [float(a / b) if b > 0 else 0.0 for a, b in zip(num, den)]


def objectives_from_sums(sums, n_blocks: int, g: int) -> Objectives:
    """Objectives from one kernel row (see kernels.speculative.population_objectives),
    read through ``evolve.kernels.layout``."""
    s = np.asarray(sums, dtype=np.float64)
    L = layout.sums_layout(g)
    tok, tv, kl, extra = s[L.tokens], s[L.tv], s[L.kl], s[L.extra]
    num, den, tvp = s[L.acc_num], s[L.reach], s[L.tv_pos]
    mean = tok / n_blocks
    var = max(s[L.tokens_sq] / n_blocks - mean * mean, 0.0) * n_blocks / max(n_blocks - 1, 1)
    return Objectives(g, n_blocks, float(mean), float(np.sqrt(var / n_blocks)),
                      float(tv / tok), float(kl / tok), float(extra / tok),
                      _ratio(num, den), tuple(float(x) for x in den / n_blocks),
                      _ratio(tvp, den))


def threshold_objectives(h, sa: TraceArrays, with_kl: bool = True) -> Objectives:
    """Objectives of a threshold array over the n*k candidate rows (kernel path)."""
    from evolve.kernels.speculative import threshold_sums     # lazy: start-up (Numba)
    return objectives_from_sums(threshold_sums(h, sa, with_kl), sa.n_blocks, sa.g)


def population_results(programs, sa: TraceArrays, with_kl: bool = True) -> list:
    """``Objectives`` of every program (kernel path)."""
    from evolve.kernels.speculative import population_objectives  # lazy: start-up (Numba)
    return [objectives_from_sums(row, sa.n_blocks, sa.g)
            for row in population_objectives(programs, sa, with_kl)]


def weighted_quantile(x, w, q: float) -> float:
    """The q-quantile of values x with non-negative weights w (0.0 if no weight)."""
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    total = w.sum()
    if not total > 0:
        return 0.0
    order = np.argsort(x, kind="stable")
    cw = np.cumsum(w[order])
    i = int(np.searchsorted(cw, q * total, side="left"))
    return float(x[order][min(i, x.size - 1)])


def _ratio(num, den) -> tuple:
    """num / den per block position; 0.0 where a position is never reached."""
    return tuple(float(a / b) if b > 0 else 0.0 for a, b in zip(num, den))


# ----------------------------------------------------------- rules as arrays

def rule_thresholds(fn, sa: TraceArrays, **params) -> np.ndarray:
    """Thresholds of a vectorised rule ``fn(features: dict of (n, k) arrays, **params)``."""
    F = sa.features()
    with np.errstate(all="ignore"):
        h = np.asarray(fn(F, **params), dtype=np.float64)
    return np.ascontiguousarray(np.broadcast_to(h, (sa.n, sa.k)).reshape(-1))


def paired_tokens_difference(sa: TraceArrays, h_a, h_b) -> tuple[float, float]:
    """Tokens per call of rule a minus rule b, with the standard error of the
    difference over blocks (both rules see the same blocks, so the pairing
    removes most of the between-block variance)."""
    ta = block_sums(sa, position_terms(sa, h_a))["tokens"]
    tb = block_sums(sa, position_terms(sa, h_b))["tokens"]
    d = ta - tb
    se = float(d.std(ddof=1) / np.sqrt(d.size)) if d.size > 1 else float("nan")
    return float(d.mean()), se
