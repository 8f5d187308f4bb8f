"""How every input of the registry (``evolve.lang.features``) is computed, once.

Two ways, one entry each per input:

- ``AT_SLOTS``: from what a decoder holds at drafted slots (``Slots``: the full target
  and draft distributions p, q, the tokens whose inputs are asked, the slots'
  sequence and block positions), in numpy or in torch on the models' device (the
  n-gram and task decoders, ``evolve.data.emission`` over the whole vocabulary, the
  lookahead estimate, the Hugging Face recorder and decoder);
- ``FROM_COLUMNS``: from a trace split's recorded columns, at each drafted row's own
  token (``drafted``) or at every one of its draft candidates (``candidates``): the
  input matrices of the objectives.

Each array library brings its own elementary functions: ``NUMPY`` (the definitions
below: ``entropy``, ``slot_features``, ``lookahead_features``; ``evolve.data.decode``
decodes with them) and ``evolve.data.sources.hf.device.OPS`` (their torch forms, tested
equal to them); the inputs are written once over them. A new input is a row of the
registry and an entry in each table here (the import-time check below refuses an
input without them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from evolve.data import vocab_class as VC
from evolve.lang.features import (ALL_INPUT_NAMES, BY_NAME, PATH_GROUPS, PATH_INPUTS,
                                  REGISTRY)

# the inputs that depend on the path decoding takes (evolve.lang.features.PATH_GROUPS)
ON_PATH = tuple(i.name for i in REGISTRY if i.group in PATH_GROUPS) + PATH_INPUTS


def entropy(P: np.ndarray) -> np.ndarray:
    """Entropy in nats of each row of a probability matrix."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(P > 0, P * np.log(P), 0.0)
    return np.maximum(-t.sum(axis=-1), 0.0)



KL_FLOOR = 1e-300     # log max(., KL_FLOOR): a KL with q(x) = 0 < p(x) is large, finite


def slot_features(p: np.ndarray, q: np.ndarray) -> dict:
    """The schema-v3 slot features (``evolve.data.traces.V3_FIELDS``) of each row of
    the full target and draft distributions p, q (B, V), in float64: ``slot_tv`` =
    sum max(0, q - p) (= TV(p, q), the standard rule's rejection probability),
    ``slot_kl_pq`` = KL(p || q) and ``slot_kl_qp`` = KL(q || p), each summed over the
    support of its first argument with the other floored at 1e-300, and
    ``slot_n_q_gt_p``, the number of tokens with q > p. The one definition: every
    decoder records these (the Hugging Face one computes the same on its device)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    return {"slot_tv": np.maximum(q - p, 0.0).sum(axis=-1),
            "slot_kl_pq": _kl(p, q), "slot_kl_qp": _kl(q, p),
            "slot_n_q_gt_p": (q > p).sum(axis=-1).astype(np.int64)}


def lookahead_features(slot_tv: np.ndarray, g: int) -> dict:
    """The lookahead inputs (``evolve.lang.features.LOOKAHEAD_INPUT_NAMES``) of rows in
    block order (g consecutive rows per block, as traces and both decoders hold them),
    from their slot TVs: ``next_tv`` at slot j is the slot TV of slot j + 1 of the same
    block (0 at the last slot), and ``ahead`` the expected number of later drafts the
    standard rule accepts after an acceptance at j, sum over m > j of prod over
    j < i <= m of (1 - TV_i), computed from the block's end as
    ahead_j = (1 - TV_(j+1)) (1 + ahead_(j+1)), ahead_(g-1) = 0. The one definition:
    the trace objectives and both decoders use it (the Hugging Face one repeats
    these steps on its device)."""
    tv = np.asarray(slot_tv, dtype=np.float64).reshape(-1, g)
    nxt = np.zeros_like(tv)
    nxt[:, :-1] = tv[:, 1:]
    ahead = np.zeros_like(tv)
    for j in range(g - 2, -1, -1):
        ahead[:, j] = (1.0 - tv[:, j + 1]) * (1.0 + ahead[:, j + 1])
    return {"next_tv": nxt.reshape(-1), "ahead": ahead.reshape(-1)}


def matches_ahead(match: np.ndarray, g: int) -> np.ndarray:
    """At each slot of rows in block order (g per block), how many of the block's later
    drafts in a row are the target's top token (``match``: per slot): m_j = match_(j+1)
    (1 + m_(j+1)), m_(g-1) = 0. The one definition of ``next_matches`` (the Hugging
    Face decoder repeats these steps on its device)."""
    m = np.asarray(match, dtype=np.float64).reshape(-1, g)
    out = np.zeros_like(m)
    for j in range(g - 2, -1, -1):
        out[:, j] = m[:, j + 1] * (1.0 + out[:, j + 1])
    return out.reshape(-1)


def count_before(flag: np.ndarray, g: int) -> np.ndarray:
    """At each slot of rows in block order, how many earlier slots of its block are
    flagged (an exclusive running count within the block)."""
    f = np.asarray(flag, dtype=np.float64).reshape(-1, g)
    out = np.zeros_like(f)
    for j in range(1, g):
        out[:, j] = out[:, j - 1] + f[:, j - 1]
    return out.reshape(-1)


def slot_columns(columns: dict) -> dict | None:
    """The slot features of a split's columns: recorded (schema v3), else computed
    from the candidates where they hold all of both distributions' mass (zero tails:
    every other token has p = q = 0 and adds nothing), else None."""
    names = ("slot_tv", "slot_kl_pq", "slot_kl_qp", "slot_n_q_gt_p")
    if all(f in columns for f in names):
        return {f: columns[f] for f in names}
    if (np.asarray(columns["tail_draft_prob"]) == 0.0).all() and \
            (np.asarray(columns["tail_target_prob"]) == 0.0).all():
        return slot_features(columns["cand_target_prob"], columns["cand_draft_prob"])
    return None


def rank_columns(columns: dict) -> dict | None:
    """The target's ranks of a split's drafted tokens and candidates: recorded (schema
    v4), else computed from the candidates where they hold all of both distributions'
    mass (every other token has p = 0 and is below them), else None."""
    names = ("target_rank", "cand_target_rank")
    if all(f in columns for f in names):
        return {f: columns[f] for f in names}
    if (np.asarray(columns["tail_draft_prob"]) == 0.0).all() and \
            (np.asarray(columns["tail_target_prob"]) == 0.0).all():
        cp = np.asarray(columns["cand_target_prob"], dtype=np.float64)
        return {"target_rank": ranks(cp, columns["target_prob"]),
                "cand_target_rank": ranks(cp, cp)}
    return None


def slots_missing(columns: dict, source: str) -> str:
    """"" if ``slot_columns`` finds the slot features, else why not (one line)."""
    if slot_columns(columns) is not None:
        return ""
    return (f"{source}: field 'slot_tv' is missing (a schema v2 split whose candidates "
            "miss some of the mass); rules that read the slot features need traces "
            "recorded with them (`evolve data trace`)")


def _kl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    pos = a > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(pos, a * (np.log(np.where(pos, a, 1.0))
                               - np.log(np.maximum(b, KL_FLOOR))), 0.0)
    return t.sum(axis=-1)


@dataclass(frozen=True)
class Ops:
    """One array library's elementary functions over (M, V) rows."""
    take: Callable           # take(P (M, V), x (M,) or (M, T)) -> P at x
    per_row: Callable        # per_row(v (M,), shape of x) -> v repeated over x's columns
    entropy: Callable        # (M, V) -> (M,)
    argmax: Callable
    amax: Callable
    slot_features: Callable  # (p, q) -> {slot_tv, slot_kl_pq, slot_kl_qp, ...} (M,) each
    lookahead: Callable      # (slot_tv (M,), g) -> {next_tv, ahead}
    vocab: Callable          # (V, device of p) -> arange(V) as a (1, V) row
    matches_ahead: Callable  # (match (M,), g) -> later drafts in a row that match
    count_before: Callable   # (flag (M,), g) -> earlier flagged slots of the block
    log: Callable            # element-wise natural log
    rank: Callable           # (P (M, V), values (M,) or (M, T)) -> #{y: P[m, y] > value}


def _np_take(P, x):
    x = np.asarray(x, dtype=np.int64)
    if x.ndim == 1:
        return P[np.arange(x.size), x]
    return np.take_along_axis(P, x, axis=1)


def _np_per_row(v, shape):
    v = np.asarray(v)
    if len(shape) == 1:
        return v
    return np.repeat(v[:, None], shape[1], axis=1)


def ranks(P: np.ndarray, values) -> np.ndarray:
    """How many entries of each row of P (M, V) are above each of its values, (M,) or
    (M, T), int64: the target's rank of a token whose probability is the value (0: its
    top token; ties share a rank)."""
    v = np.asarray(values, dtype=np.float64)
    one = v.ndim == 1
    v = v[:, None] if one else v
    S = np.sort(np.asarray(P, dtype=np.float64), axis=1)
    out = np.empty(v.shape, dtype=np.int64)
    for i in range(S.shape[0]):
        out[i] = S.shape[1] - np.searchsorted(S[i], v[i], side="right")
    return out[:, 0] if one else out


NUMPY = Ops(_np_take, _np_per_row, entropy, lambda P: np.argmax(P, axis=1),
            lambda P: P.max(axis=1), slot_features, lookahead_features,
            lambda V, P: np.arange(V)[None, :], matches_ahead, count_before, np.log,
            lambda P, v: ranks(P, v).astype(np.float64))


class Slots:
    """M drafted slots, as a rule's inputs are computed at them.

    ``p``, ``q``: the target's and the draft's full distributions (M, V); ``x``: the
    tokens whose inputs are asked, one per slot (M,), several (M, T) (a slot's
    candidates), or None for every token of the vocabulary (M, V); ``position`` and
    ``block_position``: each slot's (M,). The inputs that depend on the path decoding
    took (the lookahead and verify groups, ``mismatches``) come from ``g`` (the slots
    are whole blocks of g in block order, and ``drafted`` (M,), default x, the tokens
    drafted there; ``history``: name -> (M,) what the path held before each slot's block,
    ``mismatches`` the accepted mismatches of the answer so far) or are given
    (``lookahead``: name -> (M,) per slot, or per token in x's shape); else the slots
    have none. ``classes``: the vocabulary's token classes (V,) as floats, in p's array
    library (``evolve.data.vocab_class``; without them the slots have no
    ``token_class``). ``ops``: ``NUMPY``, or the torch ones
    (``evolve.data.sources.hf.device.OPS``)."""

    def __init__(self, p, q, x, position, block_position, g: int | None = None,
                 lookahead: dict | None = None, ops: Ops = NUMPY, drafted=None,
                 history: dict | None = None, classes=None):
        self.p, self.q, self.x, self.classes = p, q, x, classes
        self.position, self.block_position = position, block_position
        self.g, self.given, self.ops = g, lookahead, ops
        self.history = history or {}
        self.drafted = x if drafted is None and x is not None and len(x.shape) == 1 \
            else drafted
        self.shape = tuple(p.shape) if x is None else tuple(x.shape)
        self._slots = self._look = self._match = None

    @property
    def tokens(self):
        """The tokens asked, broadcastable to the inputs' shape."""
        return self.ops.vocab(self.p.shape[1], self.p) if self.x is None else self.x

    def at(self, P):
        """P (M, V) at the tokens asked."""
        return P if self.x is None else self.ops.take(P, self.x)

    def row(self, v):
        """A per-slot value (M,) at every token asked (a value already in the tokens'
        shape as it is)."""
        if tuple(getattr(v, "shape", ())) == self.shape and len(self.shape) > 1:
            return v
        return self.ops.per_row(v, self.shape)

    @property
    def slots(self) -> dict:
        if self._slots is None:
            self._slots = self.ops.slot_features(self.p, self.q)
        return self._slots

    @property
    def drafted_match(self):
        """Whether each slot's drafted token is the target's top one."""
        if self._match is None:
            self._match = self.drafted == self.ops.argmax(self.p)
        return self._match

    def look(self, name: str):
        if self.given is not None:
            return self.given[name]
        if name == "next_matches":
            return self.ops.matches_ahead(self.drafted_match, self.g)
        if name == "mismatches":
            return self.history["mismatches"] + self.ops.count_before(~self.drafted_match,
                                                                      self.g)
        if self._look is None:
            self._look = self.ops.lookahead(self.slots["slot_tv"], self.g)
        return self._look[name]

    def token_class(self):
        """The class of each token asked (every token's: (M, V) rows of the table)."""
        c = self.classes[self.tokens]
        return c if self.x is not None else c + 0.0 * self.p

    def has(self, name: str) -> bool:
        """Whether these slots can give the input (one that depends on the path needs
        ``g``, with the drafted tokens and the history it reads, or given values; the
        token class, the vocabulary's classes)."""
        if name == "token_class":
            return self.classes is not None
        if name not in ON_PATH:
            return True
        if self.given is not None:
            return name in self.given
        if self.g is None:
            return False
        if name in ("next_matches", "mismatches") and self.drafted is None:
            return False
        return name != "mismatches" or "mismatches" in self.history


def _slot_feature(name):
    return lambda s: s.row(s.slots[name])


def _lookahead(name):
    return lambda s: s.row(s.look(name))


AT_SLOTS: dict[str, Callable] = {
    "draft_prob": lambda s: s.at(s.q),
    "target_prob": lambda s: s.at(s.p),
    "position": lambda s: s.row(s.position),
    "draft_entropy": lambda s: s.row(s.ops.entropy(s.q)),
    "target_entropy": lambda s: s.row(s.ops.entropy(s.p)),
    "top_token_match": lambda s: s.tokens == s.row(s.ops.argmax(s.p)),
    "block_position": lambda s: s.row(s.block_position),
    "p_max": lambda s: s.row(s.ops.amax(s.p)),
    "q_max": lambda s: s.row(s.ops.amax(s.q)),
    "slot_tv": _slot_feature("slot_tv"),
    "slot_kl_pq": _slot_feature("slot_kl_pq"),
    "slot_kl_qp": _slot_feature("slot_kl_qp"),
    "next_tv": _lookahead("next_tv"),
    "ahead": _lookahead("ahead"),
    "logp_margin": lambda s: (s.row(s.ops.log(s.ops.amax(s.p)))
                              - s.ops.log(s.at(s.p))),
    "mismatches": _lookahead("mismatches"),
    "next_matches": _lookahead("next_matches"),
    "target_rank": lambda s: s.ops.rank(s.p, s.at(s.p)),
    "token_class": lambda s: s.token_class(),
}


def at_slots(s: Slots, names=ALL_INPUT_NAMES) -> dict:
    """The inputs ``names`` (those the slots can give) at the tokens asked."""
    return {n: AT_SLOTS[n](s) for n in names if s.has(n)}


# ------------------------------------------------------------ from a trace's columns

@dataclass(frozen=True)
class Columns:
    """How an input is read from a trace split's columns: at each drafted row's own
    token (``drafted``: (N,)) and at each row's draft candidates (``candidates``:
    (N, k), or (N,) for a value of the slot), from the split's columns as ``readable``
    gives them."""
    drafted: Callable
    candidates: Callable


def _slot_column(name):
    return Columns(lambda c: c[name], lambda c: c[name])


def _from_slots(name):
    return Columns(lambda c: c["slots"][name], lambda c: c["slots"][name])


def _look(c: dict) -> dict:
    if "look" not in c:              # made once, on first use
        c["look"] = lookahead_features(c["slots"]["slot_tv"], c["block_size"])
    return c["look"]


def _log(a):
    return np.log(np.maximum(np.asarray(a, dtype=np.float64), KL_FLOOR))


def _match(c: dict) -> np.ndarray:
    return np.asarray(c["token"]) == np.asarray(c["target_top"])


def _next_matches(c: dict) -> np.ndarray:
    """The recorded drafts' later matches in a row (along the recorded block)."""
    return matches_ahead(_match(c), c["block_size"])


def _recorded_mismatches(c: dict) -> np.ndarray:
    """``mismatches`` along the recorded path: the drafts the recorded (lossless) rule
    accepted in the sequence's earlier blocks that were not the target's top token (none
    in greedy decoding, which keeps only those that are), plus the block's earlier
    mismatching drafts (accepted, for this slot to be reached)."""
    g = c["block_size"]
    match = _match(c).reshape(-1, g)
    kept = match if c["greedy"] else np.asarray(c["baseline_accepts"], dtype=bool).reshape(-1, g)
    took = np.cumprod(kept, axis=1).astype(bool)
    per_block = (took & ~match).sum(axis=1).astype(np.float64)
    seq = np.asarray(c["sequence"]).reshape(-1, g)[:, 0]
    total = np.cumsum(per_block)
    starts = np.r_[True, seq[1:] != seq[:-1]]
    base = np.maximum.accumulate(np.where(starts, np.arange(seq.size), 0))
    before = total - per_block - np.where(base > 0, total[base - 1], 0.0)
    return np.repeat(before, g) + count_before(~match.reshape(-1), g)


def _from_look(name):
    return Columns(lambda c: _look(c)[name], lambda c: _look(c)[name])


FROM_COLUMNS: dict[str, Columns] = {
    "draft_prob": Columns(lambda c: c["draft_prob"], lambda c: c["cand_draft_prob"]),
    "target_prob": Columns(lambda c: c["target_prob"], lambda c: c["cand_target_prob"]),
    "position": _slot_column("position"),
    "draft_entropy": _slot_column("draft_entropy"),
    "target_entropy": _slot_column("target_entropy"),
    "top_token_match": Columns(
        lambda c: c["token"] == c["target_top"],
        lambda c: c["cand_token"].astype(np.int64) == c["target_top"][:, None]),
    "block_position": _slot_column("block_position"),
    "p_max": _slot_column("p_max"),
    "q_max": _slot_column("q_max"),
    "slot_tv": _from_slots("slot_tv"),
    "slot_kl_pq": _from_slots("slot_kl_pq"),
    "slot_kl_qp": _from_slots("slot_kl_qp"),
    "next_tv": _from_look("next_tv"),
    "ahead": _from_look("ahead"),
    "logp_margin": Columns(
        lambda c: _log(c["p_max"]) - _log(c["target_prob"]),
        lambda c: _log(c["p_max"])[:, None] - _log(c["cand_target_prob"])),
    "mismatches": Columns(lambda c: _recorded_mismatches(c), lambda c: _recorded_mismatches(c)),
    "next_matches": Columns(lambda c: _next_matches(c), lambda c: _next_matches(c)),
    "target_rank": Columns(lambda c: c["target_rank"], lambda c: c["cand_target_rank"]),
    "token_class": Columns(lambda c: c["vocab_class"][np.asarray(c["token"], np.int64)],
                           lambda c: c["vocab_class"][np.asarray(c["cand_token"], np.int64)]),
}

if set(AT_SLOTS) != set(BY_NAME) or set(FROM_COLUMNS) != set(BY_NAME):
    raise ImportError("evolve.data.inputs: every input of evolve.lang.features needs its "
                      "computation at slots and from a trace's columns")


def readable(columns: dict, meta: dict) -> dict:
    """A split's columns (``meta``: its meta.json) as ``FROM_COLUMNS`` reads them: with
    ``slots`` (the slot features, recorded or computed from full candidates) where it has
    them, the target's ranks where it has them (``rank_columns``), its block size (the
    lookahead inputs of the recorded drafts come from the slot TVs of their blocks, on
    first use) and whether it was decoded greedily."""
    slots = slot_columns(columns)
    out = {**columns, "block_size": int(meta["block_size"]),
           "greedy": meta.get("decoding") == "greedy"}
    if slots is not None:
        out["slots"] = slots
    out.update(rank_columns(columns) or {})
    if VC.META_KEY in meta:
        out["vocab_class"] = VC.from_text(meta[VC.META_KEY]).astype(np.float64)
    return out


def available(cols: dict) -> set:
    """The groups a split's columns (``readable``) hold."""
    return {"token", "trace", "answer", "verify"} | (
        {"slot", "lookahead"} if "slots" in cols else set()) | (
        {"rank"} if "target_rank" in cols and "cand_target_rank" in cols else set()) | (
        {"vocab"} if "vocab_class" in cols else set())


def input_matrix(cols: dict, at: str, groups=None) -> np.ndarray:
    """The float64 input matrix of a split (``cols``: ``readable``), one row per input
    up to the last one it holds (of ``groups``: default every group), in the registry's
    order so that an input's row is its opcode; an input in between that it does not
    hold (or of another group) is a row of NaN, which no search is offered. Over the
    drafted rows (``at="drafted"``: (rows, N)) or every row's candidates
    (``"candidates"``: (rows, N * k)), C-contiguous."""
    held = available(cols) if groups is None else available(cols) & set(groups)
    names = [i.name for i in REGISTRY]
    upto = max(k for k, i in enumerate(REGISTRY) if i.group in held) + 1
    n = len(cols["draft_prob"])
    shape = (n,) if at == "drafted" else tuple(np.asarray(cols["cand_token"]).shape)
    X = np.empty((upto,) + shape, dtype=np.float64)
    for k, name in enumerate(names[:upto]):
        if REGISTRY[k].group not in held:
            X[k] = np.nan
            continue
        v = np.asarray(getattr(FROM_COLUMNS[name], at)(cols))
        X[k] = v if v.shape == shape else v[:, None]
    return np.ascontiguousarray(X.reshape(upto, -1))
