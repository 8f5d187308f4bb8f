"""Real speculative decoding with the n-gram draft/target pair and any rule.

Used to check the offline objectives of ``evolve.objectives.spec`` against what
a decoder actually does (they agree within statistical error;
tests/test_spec_simulate.py), and by ``evolve simulate`` (``check_rule``). Rules
are those of ``evolve.rules.adapters`` (scalar functions, trees, rules of the
table). The decoder is ``evolve.data.decode``: the rule decides drafts among the
draft's top-k bytes (k from the trace configuration), the standard rule the
others; rejection resamples from ``norm(max(0, p - q))``.

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

import os
from dataclasses import asdict, dataclass, replace

import numpy as np

from evolve.data import decode as DEC
from evolve.data import emission as EM
from evolve.data import vocab_class as VC
from evolve.data.sources import ngram as NG
from evolve.errors import EvolveError
from evolve.objectives import spec
from evolve.objectives.spec import FEATURES
from evolve.rules.adapters import as_rule

# ------------------------------------------------------------------ bounds

# What one simulation may ask for. Prompts and blocks per prompt are bounded as in a
# trace build (``evolve.data.sources.ngram``); every allocation that grows with the
# options is estimated (``simulation_bytes``, ``evolve.freerun.paired.comparison_bytes``) and
# a run that would need more memory than this machine has is refused before any
# work.
MAX_PROMPTS = NG.MAX_PROMPTS
MAX_BLOCKS = NG.MAX_BLOCKS_PER_PROMPT
MAX_CONTEXTS = 1_000_000
MAX_REPS = 1_000_000
VOCAB = 256
BASE_BYTES = 256 << 20          # batches, the models' working arrays, the interpreter
PROMPT_BYTES = 4096             # a prompt's generator and seed sequence
DECODE_BATCH = DEC.BATCH        # prompts decoded at once (evolve.data.decode.decode)
FALLBACK_MEMORY = 16 << 30      # when the machine's memory cannot be read


class SizeError(EvolveError):
    """A simulation beyond its bounds: ``options`` (argument name -> value) are the
    arguments to blame, ``detail`` says what is allowed."""

    def __init__(self, options: dict, detail: str):
        self.options = dict(options)
        self.detail = detail
        super().__init__(", ".join(f"{k}={v!r}" for k, v in self.options.items())
                         + f": {detail}")

    def cli_message(self) -> str:
        """The message with the arguments as the command line's options."""
        if len(self.options) == 1:
            (k, v), = self.options.items()
            return f"--{k}: {v!r} is invalid; {self.detail}"
        return ", ".join(f"--{k} {v}" for k, v in self.options.items()) + f": {self.detail}"


def memory_limit() -> int:
    """This machine's physical memory in bytes (``FALLBACK_MEMORY`` when unknown): what
    a simulation can never exceed. (Not what is free at the moment, which would make
    the same command pass or fail with the load of other processes.)"""
    try:
        n = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_MEMORY
    return int(n) if n > 0 else FALLBACK_MEMORY


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.1f} GiB"


def check_bound(name: str, value: int, most: int) -> None:
    if value > most:
        raise SizeError({name: value}, f"expected at most {most:,}")


def check_memory(options: dict, need: int) -> None:
    """SizeError naming ``options`` when ``need`` bytes exceed this machine's memory."""
    limit = memory_limit()
    if need > limit:
        raise SizeError(options, f"would need about {_gib(need)} of memory, more than this "
                                 f"machine's {_gib(limit)}; ask for less")


def decoding_bytes(prompts: int, blocks: int, block_size: int, prompt_len: int) -> int:
    """Memory of free-running decoding (``evolve.data.decode.decode`` without records,
    an upper estimate): the prompts and their generators, the uniforms drawn up front
    (twice while they are stacked), the accepted counts (twice while joined), and one
    batch's decoded text and distributions."""
    g = block_size
    batch = min(prompts, DECODE_BATCH)
    return (prompts * (PROMPT_BYTES + prompt_len) + prompts * blocks * ((2 * g + 1) * 16 + 16)
            + batch * (prompt_len + blocks * (g + 1)) + batch * (g + 1) * VOCAB * 8 * 12)


def simulation_bytes(prompts: int, blocks: int, contexts: int, reps: int, block_size: int,
                     prompt_len: int) -> int:
    """Memory ``check_rule`` allocates for these settings (an upper estimate): the
    free-running decoding (``decoding_bytes``); the output sample's uniforms, its
    per-context draws over the vocabulary and the distributions and features at the
    contexts."""
    output = contexts * reps * 24 + reps * VOCAB * 16 + contexts * VOCAB * 8 * 16
    return BASE_BYTES + decoding_bytes(prompts, blocks, block_size, prompt_len) + output


def check_simulation(prompts: int, blocks: int, contexts: int, reps: int, block_size: int,
                     prompt_len: int) -> None:
    """SizeError for settings beyond the bounds or this machine's memory (``contexts``:
    those actually sampled, at most the split's rows)."""
    check_bound("prompts", prompts, MAX_PROMPTS)
    check_bound("blocks", blocks, MAX_BLOCKS)
    check_bound("contexts", contexts, MAX_CONTEXTS)
    check_bound("reps", reps, MAX_REPS)
    check_memory({"prompts": prompts, "blocks": blocks, "contexts": contexts, "reps": reps},
                 simulation_bytes(prompts, blocks, contexts, reps, block_size, prompt_len))


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


def decode_free(pair: NG.LMPair, rule, split: str = "test", prompts: int = 128,
                blocks: int = 16, seed: int = 1) -> DecodeResult:
    """Free-running speculative decoding from ``prompts`` held-out prompts of ``split``.

    The prompts and uniforms come from ``seed`` (a different stream from the
    trace builder's for any seed, since they are drawn from SeedSequence((seed, 1))).
    """
    cfg = pair.config
    sim_pair = _with_seed(pair, seed)
    pr, rngs = NG.prompt_starts(sim_pair, split, prompts)
    rule = None if rule is None else as_rule(rule)
    _, accepted = DEC.decode(pair, pr, rngs, blocks, rule=rule, record=False)
    return _result(accepted, cfg.block_size, se_by_row=True)


def _with_seed(pair: NG.LMPair, seed: int) -> NG.LMPair:
    cfg = replace(pair.config, seed=int(np.random.SeedSequence((seed, 1)).generate_state(1)[0]))
    return NG.LMPair(pair.target, pair.draft, pair.corpus, pair.lm_files, pair.draft_files,
                    pair.pools, cfg)


def block_starts(ts) -> tuple[np.ndarray, np.ndarray]:
    """(contexts (nb, C) uint8, positions (nb,)) of the blocks of a trace split."""
    g = int(ts.meta["block_size"])
    return ts.columns["context"][::g].copy(), ts.columns["position"][::g].copy()


def block_tokens(pair: NG.LMPair, contexts: np.ndarray, positions, rule, reps: int = 20,
                 seed: int = 2) -> np.ndarray:
    """Tokens per target call, float (M, reps): one block from each context, ``reps`` times."""
    M = contexts.shape[0]
    pr = np.repeat(contexts, reps, axis=0)
    pos0 = np.repeat(np.asarray(positions, dtype=np.int64), reps)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(M * reps)]
    rule = None if rule is None else as_rule(rule)
    _, accepted = DEC.decode(pair, pr, rngs, 1, rule=rule, record=False, pos0=pos0)
    return (accepted[:, 0] + 1.0).reshape(M, reps)


def decode_blocks(pair: NG.LMPair, contexts: np.ndarray, positions, rule, reps: int = 20,
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


def rows_probs(pair: NG.LMPair, contexts: np.ndarray):
    """p, q (M, 256) at the contexts."""
    H = np.asarray(contexts, dtype=np.uint8)[:, -pair.context_len:]
    return pair.target.probs(H), pair.draft.probs(H)


def rows_features(pair: NG.LMPair, contexts: np.ndarray, positions, block_positions,
                  lookahead: dict | None = None):
    """p, q (M, 256) at the contexts and the (M, 256) feature columns of every byte
    (``lookahead``: the contexts' lookahead inputs, ``evolve.data.emission``)."""
    p, q = rows_probs(pair, contexts)
    return p, q, EM.vocab_features(p, q, positions, block_positions, lookahead,
                                   VC.of_pair(pair))


def acceptance_matrix(pair: NG.LMPair, p, q, F, rule) -> np.ndarray:
    """a(x) for every byte: the rule on the draft's top-k, the standard rule elsewhere."""
    return EM.acceptance(p, q, F, as_rule(rule), pair.config.top_k)


exact_output = EM.exact_output


def sample_output(p, q, a, reps: int, rng) -> np.ndarray:
    """Counts (M, 256) of the emitted byte over ``reps`` independent single steps."""
    M, V = p.shape
    r = DEC.residual(p, q)
    counts = np.zeros((M, V), dtype=np.int64)
    u = rng.random((3, M, reps))
    for m in range(M):
        x = DEC.sample_rows(np.broadcast_to(q[m], (reps, V)), u[0, m])
        keep = u[1, m] < a[m, x]
        y = DEC.sample_rows(np.broadcast_to(r[m], (reps, V)), u[2, m])
        np.add.at(counts[m], np.where(keep, x, y), 1)
    return counts


def witness_estimate(counts: np.ndarray, p: np.ndarray, S: np.ndarray):
    """Mean over contexts of freq(S) - p(S), and its standard error (binomial)."""
    n = counts.sum(axis=1)
    f = (counts * S).sum(axis=1) / n
    d = f - (p * S).sum(axis=1)
    se = np.sqrt((f * (1 - f) / np.maximum(n - 1, 1)).sum()) / counts.shape[0]
    return float(d.mean()), float(se)


def output_sample(pair: NG.LMPair, contexts, positions, block_positions, rule, reps: int = 2000,
                  seed: int = 3, witness: np.ndarray | None = None,
                  lookahead: dict | None = None) -> OutputResult:
    """Sample the emitted byte at fixed contexts and compare with the target."""
    p, q, F = rows_features(pair, contexts, positions, block_positions, lookahead)
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


# --------------------------------------------------- simulation vs offline

Z_AGREE = 3.0     # |z| below this: the simulation agrees with the offline estimate


def offline_thresholds(rule, sa) -> np.ndarray:
    """Thresholds of any rule (scalar, vectorised or tree) on every candidate row of
    ``sa`` (an ``evolve.objectives.spec.TraceArrays``); scalar rules take one Python call a row."""
    F = sa.features()
    h = as_rule(rule).many({f: F[f].reshape(-1) for f in FEATURES if f in F})
    return np.ascontiguousarray(h, dtype=np.float64)


def _z(diff: float, se: float):
    if se > 0 and np.isfinite(se):
        return float(diff / se)
    return 0.0 if diff == 0 else None


def check_rule(pair: NG.LMPair, ts, rule, split: str | None = None, prompts: int | None = None,
               blocks: int | None = None, contexts: int = 200, reps: int = 2000,
               seed: int = 1, progress=None) -> dict:
    """Real speculative decoding with ``rule`` next to the offline exact objectives of
    the same rule on the trace split ``ts`` (``pair`` built from its configuration).

    Tokens per target call: ``decode_free`` from ``prompts`` prompts of the split's
    pool (default: as many as the split has), ``blocks`` blocks each, standard
    error over sequences; offline: ``spec`` on the split, standard error over the
    split's sequences (blocks of a sequence are not independent). Distortion: the
    emitted byte sampled ``reps`` times at ``contexts`` contexts of the split
    (``output_sample``), TV estimated with the exact witness set {out > p} (an
    unbiased estimate of the TV there), against the offline exact TV at those
    same contexts (a rule that reads the lookahead inputs sees there the split's
    recorded ones, as the offline objectives do). ``z`` = difference / its standard
    error. ``progress``, if given, is called with a line of text before each stage.
    Settings beyond the bounds or this machine's memory raise SizeError before any
    work (``check_simulation``)."""
    say = progress or (lambda text: None)
    split = split or ts.name
    cfg = pair.config
    prompts = cfg.prompts(split) if prompts is None else int(prompts)
    blocks = cfg.blocks_per_prompt if blocks is None else int(blocks)
    check_simulation(prompts, blocks, min(int(contexts), len(ts)), int(reps), cfg.block_size,
                     cfg.prompt_len)
    rule = as_rule(rule)
    say(f"offline: exact objectives on {split} ({len(ts):,} drafted positions)")
    sa = spec.TraceArrays.from_split(ts)
    terms = spec.position_terms(sa, offline_thresholds(rule, sa))
    off = spec.objectives_from_terms(sa, terms)
    tok_b = spec.block_sums(sa, terms)["tokens"]
    seq = np.unique(ts.columns["sequence"][::sa.g], return_inverse=True)[1]
    per_seq = np.bincount(seq, tok_b) / np.bincount(seq)
    off_se = float(per_seq.std(ddof=1) / np.sqrt(per_seq.size)) if per_seq.size > 1 else np.nan

    say(f"simulation: {prompts} prompts x {blocks} blocks of free-running decoding")
    free = decode_free(pair, rule, split=split, prompts=prompts, blocks=blocks, seed=seed)

    rows = trace_rows(ts, contexts, seed=seed)
    say(f"simulation: the emitted byte sampled {reps} times at {rows.size} contexts")
    ctx, pos, bpos = (ts.columns[f][rows] for f in ("context", "position", "block_position"))
    look = EM.trace_lookahead(ts, rows)
    p, q, F = rows_features(pair, ctx, pos, bpos, look)
    S = exact_output(p, q, acceptance_matrix(pair, p, q, F, rule)) > p
    out = output_sample(pair, ctx, pos, bpos, rule, reps=reps, seed=seed, witness=S,
                        lookahead=look)
    tv_ctx = float(terms.tv[rows].mean())

    d_tok = free.tokens_per_call - off.tokens_per_call
    se_tok = float(np.hypot(free.tokens_se, off_se))
    d_tv = out.tv_witness - tv_ctx
    z_tok, z_tv = _z(d_tok, se_tok), _z(d_tv, out.tv_witness_se)
    agree = all(z is not None and abs(z) < Z_AGREE for z in (z_tok, z_tv))
    return {
        "split": split, "block_size": sa.g, "top_k": sa.k,
        "settings": {"prompts": prompts, "blocks": blocks, "contexts": int(rows.size),
                     "reps": int(reps), "seed": int(seed)},
        "simulated": {**free.to_dict(), "output": out.to_dict()},
        "offline": {**off.to_dict(), "tokens_se_by_sequence": off_se,
                    "sequences": int(per_seq.size), "tv_at_contexts": tv_ctx},
        "agreement": {"tokens_per_call": {"difference": float(d_tok), "se": se_tok, "z": z_tok},
                      "tv_at_contexts": {"difference": float(d_tv),
                                         "se": float(out.tv_witness_se), "z": z_tv},
                      "z_agree": Z_AGREE, "agree": bool(agree)},
    }
