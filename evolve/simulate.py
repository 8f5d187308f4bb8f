"""Real speculative decoding with the trained draft/target pair and any rule.

Used to check the offline objectives of ``evolve.spec`` against what a decoder
actually does (they agree within statistical error; tests/test_spec_simulate.py),
and by ``evolve simulate`` (phase 2).

A rule is a scalar function in the style of ``heuristics.baselines`` (six
positional arguments: draft_prob, target_prob, position, draft_entropy,
target_entropy, top_token_match) or one that also takes ``block_position``,
``p_max`` and ``q_max`` (as keyword arguments; every argument is passed by
name then); ``as_rule`` wraps either, ``vector_rule`` wraps a numpy rule of the
``evolve.pareto`` kind. The decoder is the one ``evolve.spec`` describes: the
rule decides drafts among the draft's top-k bytes (k from the trace
configuration), the standard rule the others; rejection resamples from
``norm(max(0, p - q))``.

Three measurements:

``decode_free``   free-running decoding from held-out prompts (the rule's own
                  trajectory): tokens per target call, with a standard error over
                  sequences, and the empirical acceptance per block position.
``decode_blocks`` one block from each of a set of fixed block-start contexts,
                  repeated: the quantity ``spec`` estimates offline from a trace.
``output_sample`` the emitted byte at fixed contexts (from a trace), sampled
                  ``reps`` times each: empirical output distribution vs the
                  target's. Reported: the plug-in TV (biased upwards by sampling
                  noise; ``tv_plugin_floor`` is the same statistic for samples
                  drawn from p itself) and an unbiased witness estimate
                  ``out(S) - p(S)`` of TV, with S = {x: out(x) > p(x)} chosen on one
                  half of the samples and measured on the other (a lower bound of
                  TV that is tight once S is right), or with S given by the caller
                  (e.g. the exact sets from ``spec``: then it estimates TV itself).
"""

from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import numpy as np

from evolve import lm as LM
from evolve import traces as T
from evolve.spec import FEATURES

V1_ARGS = FEATURES[:6]
EXTRA_ARGS = FEATURES[6:]


class Rule:
    """A scalar rule applied element-wise to feature columns."""

    def __init__(self, fn, extended: bool, name: str = ""):
        self.fn = fn
        self.extended = extended
        self.name = name or getattr(fn, "__name__", "rule")

    def __call__(self, **features) -> float:
        if self.extended:
            return float(self.fn(**features))
        return float(self.fn(*(features[f] for f in V1_ARGS)))

    def many(self, F: dict) -> np.ndarray:
        """Thresholds for columns of features (1-D arrays of equal length)."""
        cols = [np.asarray(F[f]).tolist() for f in FEATURES]
        n = len(cols[0])
        pos, bpos = cols[2], cols[6]
        match = cols[5]
        out = np.empty(n, dtype=np.float64)
        fn = self.fn
        if self.extended:
            for i in range(n):
                out[i] = fn(draft_prob=cols[0][i], target_prob=cols[1][i], position=int(pos[i]),
                            draft_entropy=cols[3][i], target_entropy=cols[4][i],
                            top_token_match=bool(match[i]), block_position=int(bpos[i]),
                            p_max=cols[7][i], q_max=cols[8][i])
        else:
            for i in range(n):
                out[i] = fn(cols[0][i], cols[1][i], int(pos[i]), cols[3][i], cols[4][i],
                            bool(match[i]))
        return out


class VectorRule:
    """A numpy rule ``fn(features: dict of arrays, **params) -> thresholds``."""

    def __init__(self, fn, name: str = "", **params):
        self.fn = fn
        self.params = params
        self.name = name or getattr(fn, "__name__", "rule")

    def many(self, F: dict) -> np.ndarray:
        F = {f: np.asarray(F[f], dtype=np.float64) for f in FEATURES}
        with np.errstate(all="ignore"):
            h = np.asarray(self.fn(F, **self.params), dtype=np.float64)
        return np.broadcast_to(h, F["draft_prob"].shape).copy()


def as_rule(fn, name: str = "") -> Rule:
    """Wrap a scalar rule: six positional v1 arguments, or every feature by name."""
    if isinstance(fn, (Rule, VectorRule)):
        return fn
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return Rule(fn, False, name)
    names = set(params)
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extended = var_kw or any(a in names for a in EXTRA_ARGS)
    if extended and not (var_kw or set(FEATURES) <= names):
        missing = [f for f in FEATURES if f not in names]
        raise TypeError(f"rule {getattr(fn, '__name__', fn)!r} takes some of block_position/"
                        f"p_max/q_max but not {missing[0]!r} (extended rules take all nine "
                        f"features by name)")
    return Rule(fn, extended, name)


def vector_rule(fn, name: str = "", **params) -> VectorRule:
    return VectorRule(fn, name, **params)


# --------------------------------------------------------------- decoding

@dataclass(frozen=True)
class DecodeResult:
    block_size: int
    n_blocks: int
    n_sequences: int
    tokens_per_call: float
    tokens_se: float
    acceptance: tuple          # empirical P(accept j | reached j), per block position

    def to_dict(self) -> dict:
        d = asdict(self)
        d["acceptance"] = list(self.acceptance)
        return d


def _result(accepted: np.ndarray, g: int, se_by_row: bool) -> DecodeResult:
    tok = accepted + 1.0
    n, blocks = accepted.shape
    if se_by_row:      # sequences are independent; blocks within one are not
        per = tok.mean(axis=1)
        se = per.std(ddof=1) / np.sqrt(n) if n > 1 else float("nan")
    else:
        se = tok.std(ddof=1) / np.sqrt(tok.size) if tok.size > 1 else float("nan")
    reach = np.stack([(accepted >= j).sum() for j in range(g)]).astype(np.float64)
    passed = np.stack([(accepted >= j + 1).sum() for j in range(g)]).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = passed / reach
    return DecodeResult(g, int(tok.size), int(n), float(tok.mean()), float(se),
                        tuple(float(a) for a in acc))


def decode_free(pair: T.LMPair, rule, split: str = "test", prompts: int = 128,
                blocks: int = 16, seed: int = 1) -> DecodeResult:
    """Free-running speculative decoding from ``prompts`` held-out prompts of ``split``.

    The prompts and uniforms come from ``seed`` (a different stream from the
    trace builder's for any seed, since they are drawn from SeedSequence((seed, 1))).
    """
    cfg = pair.config
    sim_pair = _with_seed(pair, seed)
    pr, rngs = T.prompt_starts(sim_pair, split, prompts)
    rule = None if rule is None else as_rule(rule)
    _, accepted = T.decode(pair, pr, rngs, blocks, rule=rule, record=False)
    return _result(accepted, cfg.block_size, se_by_row=True)


def _with_seed(pair: T.LMPair, seed: int) -> T.LMPair:
    from dataclasses import replace
    cfg = replace(pair.config, seed=int(np.random.SeedSequence((seed, 1)).generate_state(1)[0]))
    return T.LMPair(pair.target, pair.draft, pair.corpus, pair.lm_files, pair.draft_files,
                    pair.pools, cfg)


def block_starts(ts) -> tuple[np.ndarray, np.ndarray]:
    """(contexts (nb, C) uint8, positions (nb,)) of the blocks of a trace split."""
    g = int(ts.meta["block_size"])
    return ts.columns["context"][::g].copy(), ts.columns["position"][::g].copy()


def block_tokens(pair: T.LMPair, contexts: np.ndarray, positions, rule, reps: int = 20,
                 seed: int = 2) -> np.ndarray:
    """Tokens per target call, float (M, reps): one block from each context, ``reps`` times."""
    M = contexts.shape[0]
    pr = np.repeat(contexts, reps, axis=0)
    pos0 = np.repeat(np.asarray(positions, dtype=np.int64), reps)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(M * reps)]
    rule = None if rule is None else as_rule(rule)
    _, accepted = T.decode(pair, pr, rngs, 1, rule=rule, record=False, pos0=pos0)
    return (accepted[:, 0] + 1.0).reshape(M, reps)


def decode_blocks(pair: T.LMPair, contexts: np.ndarray, positions, rule, reps: int = 20,
                  seed: int = 2) -> DecodeResult:
    """One block from each context, ``reps`` times; SE conditional on the contexts."""
    tok = block_tokens(pair, contexts, positions, rule, reps, seed)
    M = tok.shape[0]
    g = pair.config.block_size
    res = _result((tok - 1).astype(np.int64).reshape(-1, 1), g, se_by_row=False)
    if reps > 1:   # within-context variance only: the contexts are fixed
        se = float(np.sqrt(tok.var(axis=1, ddof=1).sum()) / (M * np.sqrt(reps)))
        res = DecodeResult(res.block_size, res.n_blocks, M, res.tokens_per_call, se,
                           res.acceptance)
    return res


# ------------------------------------------------------ output distribution

@dataclass(frozen=True)
class OutputResult:
    contexts: int
    reps: int
    tv_plugin: float           # mean over contexts of TV(empirical, p)
    tv_plugin_floor: float     # the same for reps samples from p itself (noise level)
    tv_witness: float          # mean over contexts of out(S) - p(S), measured on held-out samples
    tv_witness_se: float

    def to_dict(self) -> dict:
        return asdict(self)


def rows_features(pair: T.LMPair, contexts: np.ndarray, positions, block_positions):
    """p, q (M, 256) at the contexts and the (M, 256) feature columns of every byte."""
    C = pair.context_len
    H = np.asarray(contexts, dtype=np.uint8)[:, -C:]
    p = pair.target.probs(H)
    q = pair.draft.probs(H)
    M, V = p.shape
    top = np.argmax(p, axis=1)
    F = {"draft_prob": q, "target_prob": p,
         "position": np.repeat(np.asarray(positions, np.int64)[:, None], V, axis=1),
         "draft_entropy": np.repeat(LM.entropy(q)[:, None], V, axis=1),
         "target_entropy": np.repeat(LM.entropy(p)[:, None], V, axis=1),
         "top_token_match": np.arange(V)[None, :] == top[:, None],
         "block_position": np.repeat(np.asarray(block_positions, np.int64)[:, None], V, axis=1),
         "p_max": np.repeat(p.max(axis=1)[:, None], V, axis=1),
         "q_max": np.repeat(q.max(axis=1)[:, None], V, axis=1)}
    return p, q, F


def acceptance_matrix(pair: T.LMPair, p, q, F, rule) -> np.ndarray:
    """a(x) for every byte: the rule on the draft's top-k, the standard rule elsewhere."""
    M, V = p.shape
    rule = as_rule(rule)
    h = rule.many({f: F[f].reshape(-1) for f in FEATURES}).reshape(M, V)
    a = np.where(h > 0.0, np.where(h > 1.0, 1.0, h), 0.0)
    k = pair.config.top_k
    order = np.argsort(-q, axis=1, kind="stable")[:, :k]
    in_top = np.zeros((M, V), dtype=bool)
    np.put_along_axis(in_top, order, True, axis=1)
    return np.where(in_top, a, np.minimum(1.0, p / q))


def exact_output(p, q, a) -> np.ndarray:
    """The emitted byte's distribution q a + (1 - beta) r, over the full vocabulary."""
    beta = (q * a).sum(axis=1)
    r = T.residual(p, q)
    r = r / r.sum(axis=1, keepdims=True)
    return q * a + (1.0 - beta)[:, None] * r


def sample_output(p, q, a, reps: int, rng) -> np.ndarray:
    """Counts (M, 256) of the emitted byte over ``reps`` independent single steps."""
    M, V = p.shape
    r = T.residual(p, q)
    counts = np.zeros((M, V), dtype=np.int64)
    u = rng.random((3, M, reps))
    for m in range(M):
        x = T.sample_rows(np.broadcast_to(q[m], (reps, V)), u[0, m])
        keep = u[1, m] < a[m, x]
        y = T.sample_rows(np.broadcast_to(r[m], (reps, V)), u[2, m])
        np.add.at(counts[m], np.where(keep, x, y), 1)
    return counts


def witness_estimate(counts: np.ndarray, p: np.ndarray, S: np.ndarray):
    """Mean over contexts of freq(S) - p(S), and its standard error (binomial)."""
    n = counts.sum(axis=1)
    f = (counts * S).sum(axis=1) / n
    d = f - (p * S).sum(axis=1)
    se = np.sqrt((f * (1 - f) / np.maximum(n - 1, 1)).sum()) / counts.shape[0]
    return float(d.mean()), float(se)


def output_sample(pair: T.LMPair, contexts, positions, block_positions, rule, reps: int = 2000,
                  seed: int = 3, witness: np.ndarray | None = None) -> OutputResult:
    """Sample the emitted byte at fixed contexts and compare with the target."""
    p, q, F = rows_features(pair, contexts, positions, block_positions)
    a = acceptance_matrix(pair, p, q, F, rule)
    rng = np.random.default_rng(seed)
    if witness is None:
        c1 = sample_output(p, q, a, reps, rng)
        S = c1 / reps > p
        counts = sample_output(p, q, a, reps, rng)
    else:
        S = np.asarray(witness, dtype=bool)
        counts = sample_output(p, q, a, reps, rng)
    tv_w, se = witness_estimate(counts, p, S)
    plug = 0.5 * np.abs(counts / reps - p).sum(axis=1).mean()
    ones = np.ones_like(a)
    floor_counts = sample_output(p, p, ones, reps, rng)     # draft == target: samples from p
    floor = 0.5 * np.abs(floor_counts / reps - p).sum(axis=1).mean()
    return OutputResult(int(p.shape[0]), int(reps), float(plug), float(floor), tv_w, se)


def trace_rows(ts, n: int, seed: int = 4) -> np.ndarray:
    """A seeded sample of ``n`` row indices of a trace split (held-out contexts)."""
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(len(ts), size=min(n, len(ts)), replace=False))
