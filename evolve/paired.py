"""Paired free-running comparison of acceptance rules: the final arbiter.

Every rule decodes the same prompts with the same uniforms (common random
numbers: each prompt owns a generator, and all its uniforms are drawn up front
by the decoder), each from its own trajectory, with the pair that made the
traces: the n-gram pair (``evolve.data.decode``) or a Hugging Face pair
(``evolve.data.sources.hf_free``). Per rule:

- tokens per target call, with a standard error clustered by sequence (the
  blocks of one sequence are not independent; sequences are);
- the exact distortion along the rule's own trajectory: at every drafted
  position the rule reached, the emitted token's distribution
  ``out = q a + (1 - beta) r`` is computed over the full vocabulary and its TV
  and KL from the target's ``p`` are summed; per emitted token (the bonus token
  comes from ``p``: no distortion), per block position, and the 99th
  percentile of the per-position (slot) TV. A rule that reads the lookahead
  inputs decides at a slot by the drafts after it, so its emission there is
  estimated (``evolve.data.lookahead_emission``: every candidate, sampled later
  drafts, the tilt of reaching the slot) at a random sample of the reached slots,
  weighted in the per-sequence sums by their sampling probability, and labelled
  (``distortion``: kind ``estimate``, the slots and futures used, and the mean slot
  TV at half the futures, whose difference bounds the ratio's bias); on a Hugging
  Face pair its distortion is not measured (None);
- sequence-level fidelity: the mean log-likelihood per emitted token of the
  generated text under the target and under the draft. The standard rule's
  output is distributed as the target's own samples, so a rule whose text the
  draft likes better than the target's own samples is steering the text
  towards what the draft predicts well, which per-token TV does not show.

Each rule is compared with the first (the reference) by paired differences
per sequence: mean, standard error by sequence and a 95% interval.
"""

from __future__ import annotations

import numpy as np

from evolve.data import decode as DEC
from evolve.data import emission as EM
from evolve.data import lookahead_emission as LE
from evolve.data.sources import hf_free
from evolve.data.sources import ngram as NG
from evolve.rules.adapters import as_rule
from dataclasses import replace
from evolve.simulate import rows_probs
from evolve.simulate import decoding_bytes
from evolve.simulate import MAX_BLOCKS, MAX_PROMPTS, SizeError, check_bound, check_memory

CHUNK = 20_000          # rows of full distributions evaluated at once (memory)
Z95 = 1.959963984540054


def seeded_pair(pair: NG.LMPair, seed: int) -> NG.LMPair:
    cfg = replace(pair.config, seed=int(np.random.SeedSequence((seed, 7)).generate_state(1)[0]))
    return NG.LMPair(pair.target, pair.draft, pair.corpus, pair.lm_files, pair.draft_files,
                     pair.pools, cfg)


# A rule that reads the lookahead inputs: its emission is estimated
# (``evolve.data.lookahead_emission``) at this many reached slots, drawn at random,
# each with this many sampled futures per candidate.
LOOKAHEAD_SLOTS = 2000
LOOKAHEAD_FUTURES = 32


def _lookahead_distortion(pair: NG.LMPair, cols: dict, reached: np.ndarray, rule,
                          seed: int, slots: int, futures: int):
    """Estimated TV and KL at a random sample of the reached slots (each weighing
    1 / its sampling probability in the per-sequence sums), and what was estimated."""
    idx = np.flatnonzero(reached)
    rng = np.random.default_rng((seed, 11))
    pick = np.sort(rng.choice(idx.size, size=min(idx.size, slots), replace=False))
    rows = idx[pick]
    tv, kl, tv_half = LE.estimate_slots(pair, rule, cols, rows, futures, seed)
    note = {"kind": "estimate", "slots": int(rows.size), "reached": int(idx.size),
            "futures": futures, "slot_tv_mean": float(tv.mean()) if tv.size else 0.0,
            "slot_tv_mean_half_futures": float(tv_half.mean()) if tv.size else 0.0,
            "why": "the rule reads the lookahead inputs: its emitted distribution at a "
                   "slot depends on the drafts after it, estimated over sampled later "
                   "drafts at a random sample of the reached slots"}
    weight = np.full(rows.size, idx.size / max(rows.size, 1))
    return rows, tv, kl, weight, note


def _slot_distortion(pair: NG.LMPair, cols: dict, reached: np.ndarray, rule):
    """Exact TV and KL of the emitted token at every reached drafted position, for a
    rule that reads no lookahead input (``evolve.data.emission``)."""
    idx = np.flatnonzero(reached)
    tv = np.empty(idx.size)
    kl = np.empty(idx.size)
    look = DEC.lookahead_features(cols["slot_tv"], pair.config.block_size)
    for s in range(0, idx.size, CHUNK):
        r = idx[s:s + CHUNK]
        p, q = rows_probs(pair, cols["context"][r])
        tv[s:s + r.size], kl[s:s + r.size] = EM.slot_distortion(
            p, q, cols["position"][r], cols["block_position"][r], rule, pair.config.top_k,
            {f: v[r] for f, v in look.items()})
    return tv, kl


def _loglik(pair: NG.LMPair, hist: np.ndarray, lens: np.ndarray, start: int):
    """Per sequence: summed log p and log q of the generated text, and its length."""
    C = pair.context_len
    n = hist.shape[0]
    seq = np.concatenate([np.full(int(L) - start, i) for i, L in enumerate(lens)])
    pos = np.concatenate([np.arange(start, int(L)) for L in lens])
    lp = np.zeros(n)
    lq = np.zeros(n)
    for s in range(0, seq.size, CHUNK):
        i, t = seq[s:s + CHUNK], pos[s:s + CHUNK]
        ctx = hist[i[:, None], t[:, None] - C + np.arange(C)[None, :]]
        tok = hist[i, t].astype(np.int64)
        rows = np.arange(i.size)
        np.add.at(lp, i, np.log(pair.target.probs(ctx)[rows, tok]))
        np.add.at(lq, i, np.log(pair.draft.probs(ctx)[rows, tok]))
    return lp, lq, (lens - start).astype(np.float64)


def run_rule(pair, rule, split: str, prompts: int, blocks: int, seed: int,
             lookahead_slots: int = LOOKAHEAD_SLOTS,
             lookahead_futures: int = LOOKAHEAD_FUTURES) -> dict:
    """Free-running decoding of one rule; per-sequence sums (see ``compare``). ``pair``
    is the n-gram pair or an ``evolve.data.sources.hf_free.FreePair``. A rule that
    reads the lookahead inputs has its distortion estimated on the n-gram pair
    (``lookahead_slots`` sampled slots, ``lookahead_futures`` futures per candidate;
    ``distortion`` says so) and not measured on a Hugging Face pair (None)."""
    rule = as_rule(rule)
    look = EM.reads_lookahead(rule)
    if isinstance(pair, NG.LMPair):
        raw = _ngram_run(pair, rule, split, prompts, blocks, seed,
                         (lookahead_slots, lookahead_futures) if look else None)
    else:
        raw = hf_free.free_running(pair, rule, split, prompts, blocks, seed)
        if look:
            raw["distortion"] = {
                "kind": "not measured",
                "why": "the rule reads the lookahead inputs, whose emitted distribution "
                       "is estimated on the n-gram pair only"}
    accepted = raw["accepted"]
    n = accepted.shape[0]
    seq = raw["sequence"]
    w = raw.get("weight", np.ones(len(raw["tv"])))
    return {
        "tokens": (accepted + 1.0).sum(axis=1),                 # per sequence
        "calls": float(blocks),
        "tv": np.bincount(seq, raw["tv"] * w, minlength=n),
        "kl": np.bincount(seq, raw["kl"] * w, minlength=n),
        "slot_tv": raw["tv"], "slot_bpos": raw["block_position"],
        "distortion": raw.get("distortion", {"kind": "exact"}),
        "logp": raw["logp"], "logq": raw["logq"], "emitted": raw["emitted"],
        "acceptance": [float((accepted >= j + 1).sum() / max(1, (accepted >= j).sum()))
                       for j in range(pair.config.block_size)],
    }


def _ngram_run(pair: NG.LMPair, rule, split: str, prompts: int, blocks: int,
               seed: int, lookahead=None) -> dict:
    g = pair.config.block_size
    pr, rngs = NG.prompt_starts(seeded_pair(pair, seed), split, prompts)
    cols, accepted, hist, lens = DEC.decode(pair, pr, rngs, blocks, rule=rule, record=True,
                                            history=True)
    reached = cols["block_position"] <= np.repeat(accepted.reshape(-1), g)
    lp, lq, emitted = _loglik(pair, hist, lens, pr.shape[1])
    out = {"accepted": accepted, "logp": lp, "logq": lq, "emitted": emitted}
    if lookahead is not None:
        rows, tv, kl, weight, note = _lookahead_distortion(pair, cols, reached, rule, seed,
                                                           *lookahead)
        return {**out, "sequence": cols["sequence"][rows],
                "block_position": cols["block_position"][rows], "tv": tv, "kl": kl,
                "weight": weight, "distortion": note}
    tv, kl = _slot_distortion(pair, cols, reached, rule)
    return {**out, "sequence": cols["sequence"][reached],
            "block_position": cols["block_position"][reached], "tv": tv, "kl": kl}


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else np.nan


def _ratio_se(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """sum(num) / sum(den) with a cluster-robust (by sequence) standard error."""
    R = num.sum() / den.sum()
    n = num.size
    if n < 2:
        return float(R), float("nan")
    resid = num - R * den
    return float(R), float(np.sqrt((resid ** 2).sum() * n / (n - 1)) / den.sum())


def summary(r: dict, g: int) -> dict:
    tokens, se = _mean_se(r["tokens"] / r["calls"])
    tv, tv_se = _ratio_se(r["tv"], r["tokens"])
    kl, kl_se = _ratio_se(r["kl"], r["tokens"])
    measured = r["distortion"]["kind"] != "not measured"
    lp, lp_se = _ratio_se(r["logp"], r["emitted"])
    lq, lq_se = _ratio_se(r["logq"], r["emitted"])
    slot = r["slot_tv"]
    if not measured:
        tv = tv_se = kl = kl_se = None
    return {"tokens_per_call": tokens, "tokens_se": se,
            "tv_per_token": tv, "tv_se": tv_se, "kl_per_token": kl, "kl_se": kl_se,
            "distortion": r["distortion"],
            "slot_tv_by_position": [float(slot[r["slot_bpos"] == j].mean())
                                    if measured and (r["slot_bpos"] == j).any() else
                                    (None if not measured else 0.0) for j in range(g)],
            "slot_tv_p99": (float(np.quantile(slot, 0.99)) if slot.size else 0.0)
            if measured else None,
            "target_loglik_per_token": lp, "target_loglik_se": lp_se,
            "draft_loglik_per_token": lq, "draft_loglik_se": lq_se,
            "acceptance": r["acceptance"]}


def paired(a: dict, b: dict) -> dict:
    """Rule a minus rule b, paired by sequence (same prompts, same uniforms)."""
    out = {}
    unmeasured = "not measured" in (a["distortion"]["kind"], b["distortion"]["kind"])
    for key, num, den in (("tokens_per_call", "tokens", None), ("tv_per_token", "tv", "tokens"),
                          ("target_loglik_per_token", "logp", "emitted"),
                          ("draft_loglik_per_token", "logq", "emitted")):
        if key == "tv_per_token" and unmeasured:
            out[key] = {"difference": None, "se": None, "ci95": None}
            continue
        if den is None:
            d = a[num] / a["calls"] - b[num] / b["calls"]
            mean, se = _mean_se(d)
        else:   # difference of ratios, linearised per sequence
            ra, rb = a[num].sum() / a[den].sum(), b[num].sum() / b[den].sum()
            n = a[num].size
            d = (a[num] - ra * a[den]) / a[den].mean() - (b[num] - rb * b[den]) / b[den].mean()
            mean, se = float(ra - rb), float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else np.nan
        out[key] = {"difference": mean, "se": se,
                    "ci95": [mean - Z95 * se, mean + Z95 * se]}
    return out


MAX_ROWS = NG.MAX_SPLIT_ROWS   # drafted positions of one rule's run (as a trace split)
BASE_BYTES = 768 << 20          # chunks of full distributions, batches, the models


def comparison_bytes(prompts: int, blocks: int, rules: int, block_size: int, top_k: int,
                     context_len: int, prompt_len: int) -> int:
    """Memory ``compare`` allocates for these settings (an upper estimate): per rule
    run, the recorded columns of every drafted position (twice: per batch, then
    joined), the decoded text, the prompts with their generators and uniforms; the
    reached positions' slot numbers kept for every rule."""
    g = block_size
    rows = prompts * blocks * g
    per_row = 2 * (160 + 17 * top_k + context_len) + 16 * rules + 48
    text = 2 * prompts * (prompt_len + blocks * (g + 1))
    return (BASE_BYTES + decoding_bytes(prompts, blocks, g, prompt_len) + rows * per_row
            + text)


def check_comparison(prompts: int, blocks: int, rules: int, block_size: int, top_k: int,
                     context_len: int, prompt_len: int) -> None:
    """``evolve.simulate.SizeError`` for settings beyond the bounds (prompts and blocks
    as for a simulation, at most ``MAX_ROWS`` drafted positions per rule) or this
    machine's memory."""
    check_bound("prompts", prompts, MAX_PROMPTS)
    check_bound("blocks", blocks, MAX_BLOCKS)
    if prompts * blocks * block_size > MAX_ROWS:
        raise SizeError({"prompts": prompts, "blocks": blocks},
                        f"prompts x blocks x block size {block_size} is "
                        f"{prompts * blocks * block_size:,} drafted positions; expected at "
                        f"most {MAX_ROWS:,}")
    check_memory({"prompts": prompts, "blocks": blocks},
                 comparison_bytes(prompts, blocks, rules, block_size, top_k, context_len,
                                  prompt_len))


def compare(pair, rules: dict, split: str = "test", prompts: int = 4096,
            blocks: int = 16, seed: int = 1, progress=None,
            lookahead_slots: int = LOOKAHEAD_SLOTS,
            lookahead_futures: int = LOOKAHEAD_FUTURES) -> dict:
    """Every rule of ``rules`` (label -> rule) decoded free-running on the same
    prompts and uniforms; summaries, and paired differences from the first.
    Settings beyond the bounds or this machine's memory raise
    ``evolve.simulate.SizeError`` before any decoding (``check_comparison``)."""
    say = progress or (lambda text: None)
    g = pair.config.block_size
    cfg = pair.config
    check_comparison(int(prompts), int(blocks), len(rules), g, cfg.top_k,
                     int(getattr(cfg, "context_len", 0) or 0), cfg.prompt_len)
    raw = {}
    for label, rule in rules.items():
        say(f"{label}: {prompts} prompts x {blocks} blocks, free-running")
        raw[label] = run_rule(pair, rule, split, prompts, blocks, seed, lookahead_slots,
                              lookahead_futures)
    labels = list(rules)
    ref = labels[0]
    return {"split": split, "block_size": g, "prompts": prompts, "blocks": blocks,
            "seed": seed, "reference": ref,
            "rules": {k: summary(v, g) for k, v in raw.items()},
            "versus_reference": {k: paired(raw[k], raw[ref]) for k in labels[1:]}}
