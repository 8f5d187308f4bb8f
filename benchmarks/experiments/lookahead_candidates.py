"""What the free-running TV estimate of a lookahead rule costs, and how much it moves,
with the later drafts sampled after the draft's K most likely candidates only.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.experiments.lookahead_candidates
        [--data datasets/pairs/smollm2/results/traces] [--candidates 4 16 64 256]
        [--prompts 4] [--blocks 4] [--slots 6] [--futures 8] [--seed 3] [--out JSON]

It decodes ``--prompts`` test prompts of the traces' pair free-running with a rule
that reads ``ahead`` (lenient where the block's later drafts look promising), then
estimates its TV at the same ``--slots`` reached slots and the same futures' stream
once per K (``evolve.data.sources.hf.lookahead.estimate``): the seconds per slot, each
slot's TV and the worst case the cut allows (``bound``). On a real vocabulary every
candidate is out of reach (49,152 candidates x 8 futures per slot), so the largest K
is the reference the others are read against.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks.experiments import trace_results as TR  # noqa: E402
from evolve.io import paths  # noqa: E402

RULE = "pmin(1.0, pdiv(target_prob, mul(sub(1.0, mul(0.2, ahead)), draft_prob)))"
DATA = paths.DATA_DIR / "pairs" / "smollm2" / "results" / "traces"
OUT = ROOT / "benchmarks" / "experiments" / "lookahead_candidates.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--candidates", type=int, nargs="+", default=[4, 16, 64, 256])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--slots", type=int, default=6)
    ap.add_argument("--futures", type=int, default=8)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    from evolve.data.sources.hf import decode as HD, lookahead as HL, prompts as HP
    from evolve.lang import treeio
    from evolve.rules.adapters import tree_rule
    splits = TR._traces(a.data, False)
    fp = TR._pair(splits["test"], a.data)
    rule = tree_rule(treeio.parse(RULE), "ahead")
    ids, rngs = HP.split_prompts(fp.pair, "test", fp.texts, fp.corpus, n=a.prompts, draw=1)
    _, accepted, tracked = HD.decode(fp.pair, ids, rngs, a.blocks, record=False, rule=rule,
                                     track=True)
    lens = np.array([len(i) for i in ids])
    doc = {"commit": TR._commit(), "data": TR._shown(a.data), "rule": RULE,
           "vocabulary": int(fp.pair.vocab), "settings": {
               k: v for k, v in vars(a).items() if k not in ("data", "out")}, "runs": []}
    print(f"{fp.pair.vocab:,} tokens; {a.slots} slots, {a.futures} futures, rule {RULE}")
    print("| candidates | s per slot | mean slot TV | worst case (mean) | slot TVs |")
    print("|---:|---:|---:|---:|---|")
    for K in a.candidates:
        t0 = time.perf_counter()
        rows, tv, _, _, cut = HL.estimate(fp, rule, lens, accepted, tracked, a.seed, a.slots,
                                          a.futures, candidates=K)
        sec = (time.perf_counter() - t0) / max(rows.size, 1)
        bound = cut["bound"] if cut is not None else np.zeros(rows.size)
        doc["runs"].append({"candidates": K, "seconds_per_slot": round(sec, 2),
                            "block_position": tracked["block_position"][rows].tolist(),
                            "slot_tv": tv.tolist(), "bound": bound.tolist()})
        print(f"| {K} | {sec:.1f} | {tv.mean():.5f} | {bound.mean():.3f} | "
              + " ".join(f"{x:.5f}" for x in tv) + " |", flush=True)
    ref = np.array(doc["runs"][-1]["slot_tv"])
    for r in doc["runs"]:
        r["largest_difference_from_most"] = float(np.abs(np.array(r["slot_tv"]) - ref).max())
        print(f"{r['candidates']} candidates: slot TVs within "
              f"{r['largest_difference_from_most']:.5f} of {doc['runs'][-1]['candidates']}'s")
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
