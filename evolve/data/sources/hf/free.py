"""Free-running decoding with a Hugging Face pair: what ``evolve.freerun.paired`` compares.

A split recorded by the hf backend names its models and prompt source in its
meta.json; ``load`` rebuilds them (the same models, the same prompt pools), and
``free_running`` decodes ``n`` prompts of a split from a seeded draw
(``hf_prompts.split_prompts(draw=seed)``: the same prompts and uniforms for
every rule of a comparison, other ones than the recorded traces') with a rule,
from the rule's own trajectory (``hf_decode.decode``: KV caches kept across
blocks, the per-position work on the models' device). Per rule it returns the
accepted counts, the exact distortion of every reached drafted position, and the
log-likelihood of each generated text under target and draft (one
teacher-forced pass of each model over the finished sequences).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from evolve.data import lookahead_emission as LE
from evolve.data.sources import hf
from evolve.data.sources.hf import decode as HD
from evolve.data.sources.hf import lookahead as HL
from evolve.data.sources.hf import prompts as HP
from evolve.data.tokens import DataError


@dataclass
class FreePair:
    """A loaded hf pair with the prompt source of its traces."""
    pair: hf.HFPair
    texts: dict | None
    corpus: object | None
    meter: object = None     # meter(label, total, unit): a counting bar (evolve.cli.render)
    source = "hf"            # evolve.data.sources.registry (a class attribute, not a field)

    @property
    def config(self) -> hf.HFTraceConfig:
        return self.pair.config


def load(ts, where: str) -> FreePair:
    """The pair and prompts of a split's recorded configuration; DataError (one line,
    naming ``where``) when they cannot be rebuilt. The configuration and the prompts
    are checked before the models load."""
    try:
        cfg = hf.config_of(ts)
        texts, corpus, _ = hf.read_prompts(cfg)
        return FreePair(hf.load_pair(cfg), texts, corpus)
    except (hf.HFTraceError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, DataError):
            raise
        raise DataError(f"{where}: the recorded pair cannot be rebuilt: {e}") from None


def check(fp: FreePair, split: str, prompts: int | None, blocks: int) -> int:
    """The number of prompts to decode (default: a prompts file's lines of the split, or
    the configured count), or DataError (one line) when the prompts file has fewer or
    the sequences would not fit the models' position tables."""
    cfg = fp.config
    if fp.texts is not None:
        have = len(fp.texts[split])
        if prompts is not None and prompts > have:
            raise DataError(f"--prompts: {prompts}; the {split} split of {cfg.prompts_file} "
                            f"has {have} prompts")
        if have < 2:
            raise DataError(f"{cfg.prompts_file}: the {split} split has {have} prompts; a "
                            "comparison needs at least 2")
        longest = max(len(HP.encode(fp.pair.tokenizer, t)) for t in fp.texts[split])
        n = have if prompts is None else prompts
    else:
        longest = cfg.prompt_len
        n = cfg.prompts(split) if prompts is None else prompts
    try:
        HD.check_fits(fp.pair, longest, blocks)
    except ValueError as e:
        raise DataError(f"--blocks {blocks}: {e}") from None
    return int(n)


def corpus_matches(fp: FreePair, ts) -> bool:
    """Whether the prompt corpus is the one the traces were recorded from."""
    recorded = (ts.meta.get("prompts") or {}).get("crc32")
    return fp.corpus is None or recorded is None or recorded == fp.corpus.fingerprint()


def free_running(fp: FreePair, rule, split: str, prompts: int, blocks: int, seed: int,
                 lookahead=None) -> dict:
    """Decode ``prompts`` prompts of ``split`` (draw ``seed``) for ``blocks`` blocks with
    ``rule``; accepted counts, reached positions' distortion, per-sequence log-likelihoods.
    ``lookahead``: (slots, futures) of the estimate for a rule that reads the lookahead
    inputs (``evolve.data.sources.hf.lookahead``), whose distortion is then estimated at
    a random sample of the reached positions, each weighing 1 / its sampling
    probability."""
    ids, rngs = HP.split_prompts(fp.pair, split, fp.texts, fp.corpus, n=prompts, draw=seed)
    total = len(ids) * blocks * fp.config.block_size
    label = str(getattr(rule, "name", "") or "rule")
    with (fp.meter(label, total, "drafted tokens") if fp.meter
          else contextlib.nullcontext()) as m:
        _, accepted, tr = HD.decode(fp.pair, ids, rngs, blocks, record=False, rule=rule,
                                    track=True, progress=m.advance if m else None)
    lens = np.array([len(i) for i in ids])
    lp, lq, emitted = loglik(fp.pair, tr["history"], lens)
    out = {"accepted": accepted, "logp": lp, "logq": lq, "emitted": emitted}
    if lookahead is None:
        return {**out, "sequence": tr["sequence"], "block": tr["block"],
                "block_position": tr["block_position"], "tv": tr["tv"], "kl": tr["kl"]}
    slots, futures = lookahead
    with (fp.meter(f"{label}: TV estimate", min(slots, tr["sequence"].size), "slots")
          if fp.meter else contextlib.nullcontext()) as m:
        rows, tv, kl, tv_half, cut = HL.estimate(fp, rule, lens, accepted, tr, seed, slots,
                                                 futures, progress=m.advance if m else None)
    note, weight = LE.estimate_note(tr["sequence"].size, futures, tv, tv_half)
    if cut is not None and tv.size:
        note |= {"candidates": cut["candidates"], "quarter": cut["quarter"],
                 "slot_tv_mean_quarter_candidates": float(cut["tv_quarter"].mean()),
                 "candidate_bound_mean": float(cut["bound"].mean())}
    return {**out, "sequence": tr["sequence"][rows], "block": tr["block"][rows],
            "block_position": tr["block_position"][rows], "tv": tv, "kl": kl,
            "weight": weight, "distortion": note}


def loglik(pair: hf.HFPair, hist: list, starts: np.ndarray):
    """Per sequence: summed log p and log q of its tokens from ``starts`` on (the
    generated text), each model reading the whole sequence once; and their count."""
    import torch    # lazy: start-up (torch loads only where it is used)
    n = len(hist)
    lp, lq = np.zeros(n), np.zeros(n)
    B = pair.config.batch_size
    for s0 in range(0, n, B):
        part = hist[s0:s0 + B]
        ids, mask, pos, L = HD.block_inputs(part, 0)
        for model, acc in ((pair.target, lp), (pair.draft, lq)):
            with torch.no_grad():
                out = model(input_ids=torch.from_numpy(ids).to(pair.device),
                            attention_mask=torch.from_numpy(mask).to(pair.device),
                            position_ids=torch.from_numpy(pos).to(pair.device), use_cache=False)
            logp = np.log(HD.probs(out.logits, pair.vocab, pair.config.temperature))
            for i, h in enumerate(part):
                pad = L - len(h)
                t = np.arange(int(starts[s0 + i]), len(h))
                acc[s0 + i] = logp[i, pad + t - 1, h[t]].sum()
    emitted = np.array([len(h) for h in hist], dtype=np.float64) - starts
    return lp, lq, emitted
