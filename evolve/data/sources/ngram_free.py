"""Free-running decoding with the n-gram pair: what ``evolve.freerun.paired`` compares.

``free_running`` decodes ``n`` prompts of a split from a seeded draw of the split's
prompt pool (the same prompts and uniforms for every rule of a comparison) with a
rule, from the rule's own trajectory (``evolve.data.decode.decode``), and returns the
accepted counts, the distortion of the reached drafted positions (exact, from the
full distributions, ``evolve.data.emission``; for a rule that reads the lookahead
inputs estimated at a sample of them, ``evolve.data.lookahead_emission``) and the
log-likelihood of each generated text under target and draft. The Hugging Face
counterpart is ``evolve.data.sources.hf.free``.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import numpy as np

from evolve.data import decode as DEC
from evolve.data import emission as EM
from evolve.data import lookahead_emission as LE
from evolve.data import vocab_class as VC
from evolve.data.sources import ngram as NG

CHUNK = 20_000          # rows of full distributions evaluated at once (memory)


def rows_probs(pair: NG.LMPair, contexts: np.ndarray):
    """p, q (M, 256) at the contexts."""
    H = np.asarray(contexts, dtype=np.uint8)[:, -pair.context_len:]
    return pair.target.probs(H), pair.draft.probs(H)


def seeded_pair(pair: NG.LMPair, seed: int) -> NG.LMPair:
    cfg = replace(pair.config, seed=int(np.random.SeedSequence((seed, 7)).generate_state(1)[0]))
    return NG.LMPair(pair.target, pair.draft, pair.corpus, pair.lm_files, pair.draft_files,
                     pair.pools, cfg)


def lookahead_distortion(pair: NG.LMPair, cols: dict, reached: np.ndarray, rule,
                          seed: int, slots: int, futures: int):
    """Estimated TV and KL at a random sample of the reached slots (each weighing
    1 / its sampling probability in the per-sequence sums), and what was estimated."""
    idx = np.flatnonzero(reached)
    rows = idx[LE.sample_slots(idx.size, slots, seed)]
    tv, kl, tv_half = LE.estimate_slots(pair, rule, cols, rows, futures, seed)
    note, weight = LE.estimate_note(idx.size, futures, tv, tv_half)
    return rows, tv, kl, weight, note


def slot_distortion(pair: NG.LMPair, cols: dict, reached: np.ndarray, rule, tick=None):
    """Exact TV and KL of the emitted token at every reached drafted position, for a
    rule that reads no lookahead input (``evolve.data.emission``); ``tick()`` after each
    chunk of ``CHUNK`` positions."""
    idx = np.flatnonzero(reached)
    tv = np.empty(idx.size)
    kl = np.empty(idx.size)
    look = DEC.lookahead_features(cols["slot_tv"], pair.config.block_size)
    for s in range(0, idx.size, CHUNK):
        r = idx[s:s + CHUNK]
        p, q = rows_probs(pair, cols["context"][r])
        tv[s:s + r.size], kl[s:s + r.size] = EM.slot_distortion(
            p, q, cols["position"][r], cols["block_position"][r], rule, pair.config.top_k,
            {f: v[r] for f, v in look.items()}, VC.of_pair(pair))
        if tick is not None:
            tick()
    return tv, kl


def loglik(pair: NG.LMPair, hist: np.ndarray, lens: np.ndarray, start: int, tick=None):
    """Per sequence: summed log p and log q of the generated text, and its length;
    ``tick()`` after each chunk of ``CHUNK`` tokens."""
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
        if tick is not None:
            tick()
    return lp, lq, (lens - start).astype(np.float64)


def free_running(pair: NG.LMPair, rule, split: str, prompts: int, blocks: int, seed: int,
                 lookahead=None, meter=None) -> dict:
    """One rule's free-running decoding (see the module doc); ``lookahead``: (slots,
    futures) of the estimate for a rule that reads the lookahead inputs. ``meter``
    (``meter(label, total, unit)``, the command line's bar) counts its steps: batches
    of decoding, then chunks of log-likelihoods and of distortion."""
    g = pair.config.block_size
    pr, rngs = NG.prompt_starts(seeded_pair(pair, seed), split, prompts)
    batches = -(-len(pr) // DEC.BATCH)
    with (meter(str(getattr(rule, "name", "") or "rule"), batches, "steps") if meter
          else contextlib.nullcontext()) as m:
        def tick(what):
            return (lambda: m.advance(1, what)) if m is not None else None
        cols, accepted, hist, lens = DEC.decode(pair, pr, rngs, blocks, DEC.BATCH,
                                                rule=rule, record=True, history=True,
                                                tick=tick("decoding"))
        reached = cols["block_position"] <= np.repeat(accepted.reshape(-1), g)
        if m is not None:
            tokens = int((lens - pr.shape[1]).sum())
            m.set_total(batches + -(-tokens // CHUNK) + (-(-int(reached.sum()) // CHUNK)
                                                         if lookahead is None else 0))
        lp, lq, emitted = loglik(pair, hist, lens, pr.shape[1], tick("log-likelihoods"))
        if lookahead is None:
            tv, kl = slot_distortion(pair, cols, reached, rule,
                                     tick("the emitted tokens' distortion"))
    out = {"accepted": accepted, "logp": lp, "logq": lq, "emitted": emitted}
    if lookahead is not None:
        rows, tv, kl, weight, note = lookahead_distortion(pair, cols, reached, rule, seed,
                                                          *lookahead)
        return {**out, "sequence": cols["sequence"][rows], "block": cols["block_index"][rows],
                "block_position": cols["block_position"][rows], "tv": tv, "kl": kl,
                "weight": weight, "distortion": note}
    return {**out, "sequence": cols["sequence"][reached], "block": cols["block_index"][reached],
            "block_position": cols["block_position"][reached], "tv": tv, "kl": kl}
