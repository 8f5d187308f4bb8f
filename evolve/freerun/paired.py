"""Paired free-running comparison of acceptance rules: the final arbiter.

Every rule decodes the same prompts with the same uniforms (common random
numbers: each prompt owns a generator, and all its uniforms are drawn up front
by the decoder), each from its own trajectory, with the pair that made the
traces: the n-gram pair (``evolve.data.decode``) or a Hugging Face pair
(``evolve.data.sources.hf.free``). Per rule:

- tokens per target call, with a standard error clustered by sequence (the
  blocks of one sequence are not independent; sequences are);
- the exact distortion along the rule's own trajectory: at every drafted
  position the rule reached, the emitted token's distribution
  ``out = q a + (1 - beta) r`` is computed over the full vocabulary and its TV
  and KL from the target's ``p`` are summed; per emitted token (the bonus token
  comes from ``p``: no distortion), per block position, and the 99th
  percentile of the per-position (slot) TV, and the mean slot TV by distance from
  the prompt (``tv_by_distance``: the first token of the answer, the next, ...). A
  rule that reads the lookahead
  inputs decides at a slot by the drafts after it, so its emission there is
  estimated (``evolve.data.lookahead_emission``: every candidate, sampled later
  drafts, the tilt of reaching the slot) at a random sample of the reached slots,
  weighted in the per-sequence sums by their sampling probability, and labelled
  (``distortion``: kind ``estimate``, the slots and futures used, and the mean slot
  TV at half the futures, whose difference bounds the ratio's bias); the sample's size
  is the source's (``lookahead``: 2,000 slots of 32 futures on the n-gram pair, 300
  of 8 on a Hugging Face pair, whose models read each continuation after the whole
  history);
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

from evolve.data import emission as EM
from evolve.data.distance import bins
from evolve.data.sources import ngram as NG
from evolve.data.sources.registry import source_of_pair
from evolve.rules.adapters import as_rule
from evolve.freerun.simulate import decoding_bytes
from evolve.freerun.simulate import MAX_BLOCKS, MAX_PROMPTS, SizeError, check_bound, check_memory

Z95 = 1.959963984540054


def run_rule(pair, rule, split: str, prompts: int, blocks: int, seed: int,
             lookahead_slots: int | None = None, lookahead_futures: int | None = None,
             meter=None) -> dict:
    """Free-running decoding of one rule; per-sequence sums (see ``compare``). ``pair``
    is the pair a trace source rebuilt (``evolve.data.sources.registry``), which
    decodes. A rule that reads the lookahead inputs has its distortion estimated
    (``lookahead_slots`` sampled slots, ``lookahead_futures`` futures per candidate;
    None: the source's ``lookahead`` defaults; ``distortion`` says so). ``meter``
    (``meter(label, total, unit)``) counts the progress where the source can."""
    rule = as_rule(rule)
    source = source_of_pair(pair)
    slots, futures = source.lookahead
    look = (lookahead_slots or slots, lookahead_futures or futures)
    raw = source.free_running(pair, rule, split, prompts, blocks, seed,
                              look if EM.reads_lookahead(rule) else None, meter)
    accepted = raw["accepted"]
    n = accepted.shape[0]
    seq = raw["sequence"]
    w = raw.get("weight", np.ones(len(raw["tv"])))
    return {
        "tokens": (accepted + 1.0).sum(axis=1),                 # per sequence
        "calls": float(blocks),
        "tv": np.bincount(seq, raw["tv"] * w, minlength=n),
        "kl": np.bincount(seq, raw["kl"] * w, minlength=n),
        "slot_tv": raw["tv"], "slot_bpos": raw["block_position"], "slot_w": w,
        "slot_distance": distance_from_prompt(accepted, seq, raw["block"],
                                              raw["block_position"]),
        "distortion": raw.get("distortion", {"kind": "exact"}),
        "logp": raw["logp"], "logq": raw["logq"], "emitted": raw["emitted"],
        "acceptance": [float((accepted >= j + 1).sum() / max(1, (accepted >= j).sum()))
                       for j in range(pair.config.block_size)],
    }




def distance_from_prompt(accepted: np.ndarray, seq, block, block_position) -> np.ndarray:
    """Each slot's distance from the prompt: the tokens its sequence emitted before its
    block (each block emits its accepted drafts and one more token) plus its position
    in the block; 0 is the first token after the prompt."""
    emitted = np.asarray(accepted, dtype=np.int64) + 1
    before = np.cumsum(emitted, axis=1) - emitted           # exclusive, per sequence
    return before[np.asarray(seq), np.asarray(block)] + np.asarray(block_position)


def tv_by_distance(r: dict) -> dict:
    """The mean TV of the reached slots (weighted, for an estimate) in each bin of
    ``DISTANCE_BINS`` (None where no slot falls), with the slots counted."""
    tv, w = r["slot_tv"], r["slot_w"]
    out = {}
    for label, m in bins(r["slot_distance"]):
        out[label] = {"tv": float((tv[m] * w[m]).sum() / w[m].sum())
                      if m.any() and w[m].sum() > 0 else None, "slots": int(m.sum())}
    return out


# The statistics of a paired comparison (also the task world's, evolve.freerun.task_compare):
# one value per sequence (or problem), standard errors by sequence.

def mean_se(x) -> tuple[float, float]:
    """The mean and its standard error."""
    x = np.asarray(x, dtype=np.float64)
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(x.size)) if x.size > 1 else np.nan


def ratio_se(num: np.ndarray, den: np.ndarray) -> tuple[float, float]:
    """sum(num) / sum(den) with a cluster-robust (by sequence) standard error."""
    R = num.sum() / den.sum()
    n = num.size
    if n < 2:
        return float(R), float("nan")
    resid = num - R * den
    return float(R), float(np.sqrt((resid ** 2).sum() * n / (n - 1)) / den.sum())


def ratio_difference(num_a, den_a, num_b, den_b) -> tuple[float, float]:
    """sum(num_a) / sum(den_a) - sum(num_b) / sum(den_b), paired by sequence, with its
    standard error linearised per sequence."""
    ra, rb = num_a.sum() / den_a.sum(), num_b.sum() / den_b.sum()
    n = num_a.size
    d = (num_a - ra * den_a) / den_a.mean() - (num_b - rb * den_b) / den_b.mean()
    return float(ra - rb), float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else np.nan


def interval(mean: float, se) -> dict:
    """A difference with its standard error and 95% interval."""
    return {"difference": mean, "se": se, "ci95": [mean - Z95 * se, mean + Z95 * se]}


def summary(r: dict, g: int) -> dict:
    tokens, se = mean_se(r["tokens"] / r["calls"])
    tv, tv_se = ratio_se(r["tv"], r["tokens"])
    kl, kl_se = ratio_se(r["kl"], r["tokens"])
    lp, lp_se = ratio_se(r["logp"], r["emitted"])
    lq, lq_se = ratio_se(r["logq"], r["emitted"])
    slot = r["slot_tv"]
    return {"tokens_per_call": tokens, "tokens_se": se,
            "tv_per_token": tv, "tv_se": tv_se, "kl_per_token": kl, "kl_se": kl_se,
            "distortion": r["distortion"],
            "slot_tv_by_position": [float(slot[r["slot_bpos"] == j].mean())
                                    if (r["slot_bpos"] == j).any() else 0.0 for j in range(g)],
            "slot_tv_p99": float(np.quantile(slot, 0.99)) if slot.size else 0.0,
            "tv_by_distance": tv_by_distance(r),
            "target_loglik_per_token": lp, "target_loglik_se": lp_se,
            "draft_loglik_per_token": lq, "draft_loglik_se": lq_se,
            "acceptance": r["acceptance"]}


def paired(a: dict, b: dict) -> dict:
    """Rule a minus rule b, paired by sequence (same prompts, same uniforms)."""
    out = {}
    for key, num, den in (("tokens_per_call", "tokens", None), ("tv_per_token", "tv", "tokens"),
                          ("target_loglik_per_token", "logp", "emitted"),
                          ("draft_loglik_per_token", "logq", "emitted")):
        if den is None:
            mean, se = mean_se(a[num] / a["calls"] - b[num] / b["calls"])
        else:
            mean, se = ratio_difference(a[num], a[den], b[num], b[den])
        out[key] = interval(mean, se)
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
    """``evolve.freerun.simulate.SizeError`` for settings beyond the bounds (prompts and blocks
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
            lookahead_slots: int | None = None, lookahead_futures: int | None = None,
            meter=None) -> dict:
    """Every rule of ``rules`` (label -> rule) decoded free-running on the same
    prompts and uniforms; summaries, and paired differences from the first.
    Settings beyond the bounds or this machine's memory raise
    ``evolve.freerun.simulate.SizeError`` before any decoding (``check_comparison``)."""
    say = progress or (lambda text: None)
    g = pair.config.block_size
    cfg = pair.config
    check_comparison(int(prompts), int(blocks), len(rules), g, cfg.top_k,
                     int(getattr(cfg, "context_len", 0) or 0), cfg.prompt_len)
    raw = {}
    for label, rule in rules.items():
        say(f"{label}: {prompts} prompts x {blocks} blocks, free-running")
        raw[label] = run_rule(pair, rule, split, prompts, blocks, seed, lookahead_slots,
                              lookahead_futures, meter)
    labels = list(rules)
    ref = labels[0]
    return {"split": split, "block_size": g, "prompts": prompts, "blocks": blocks,
            "seed": seed, "reference": ref,
            "rules": {k: summary(v, g) for k, v in raw.items()},
            "versus_reference": {k: paired(raw[k], raw[ref]) for k in labels[1:]}}
