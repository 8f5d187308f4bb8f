"""The task pair's figures (evolve/data/sources/task/): build time, greedy task
accuracy and bytes per problem of the target alone and of the draft alone on the
test split, and, for reference, the standard rule's accepted drafts per block
(sampled speculative decoding, blocks before the solution's end) and task accuracy.

    python -m benchmarks.experiments.task_pair [--seed 0] [--test 300] [--json]

Every figure depends on the seed only (the times on the machine); a few seconds
on one core.
"""

import argparse
import json
import sys
import time


import numpy as np  # noqa: E402

from evolve.data.decode import decode  # noqa: E402
from evolve.data.sources.task import greedy  # noqa: E402
from evolve.data.sources.task import pair as TP  # noqa: E402
from evolve.data.sources.task.checker import DelimiterChecker  # noqa: E402
from evolve.data.sources.task.grammar import PAD  # noqa: E402

MAX_NEW = 400          # bytes a greedy solution may take (the longest allowed is < 240)
DECODE_PROMPTS = 64
DECODE_BLOCKS = 96     # enough for every solution to end (at least one byte a block)


def figures(seed: int, test: int) -> dict:
    t0 = time.perf_counter()
    pair = TP.build_pair(TP.TaskPairConfig(seed=seed, test_prompts=test))
    out = {"config": pair.config.to_dict(), "build_s": round(time.perf_counter() - t0, 2)}
    prompts, rngs = TP.prompts_of(pair, "test")
    C = pair.config.context_len
    answers = [p.answer for p in pair.problems["test"]]
    for name, model in (("target", pair.target), ("draft", pair.draft)):
        t0 = time.perf_counter()
        r = greedy.accuracy(model, prompts, answers, DelimiterChecker(), MAX_NEW)
        out[name] = {"accuracy": r["accuracy"], "correct": int(r["correct"].sum()),
                     "problems": len(answers), "mean_bytes": round(r["mean_tokens"], 2),
                     "unfinished": r["unfinished"],
                     "seconds": round(time.perf_counter() - t0, 2),
                     "example": r["texts"][0].decode("utf-8", errors="replace")}
    t0 = time.perf_counter()
    _, accepted, hist, lens = decode(pair, prompts[:DECODE_PROMPTS], rngs[:DECODE_PROMPTS],
                                     DECODE_BLOCKS, history=True)
    texts = [row[C:n].tobytes() for row, n in zip(hist, lens)]
    out["standard_rule"] = {"prompts": DECODE_PROMPTS, "blocks": DECODE_BLOCKS,
                            "block_size": pair.config.block_size,
                            **_before_the_end(accepted, texts),
                            "accuracy": _accuracy(texts, answers[:DECODE_PROMPTS]),
                            "seconds": round(time.perf_counter() - t0, 2)}
    return out


def _accuracy(texts, answers) -> float:
    """Task accuracy of decoded texts, each up to its first PAD."""
    return float(np.mean([
        DelimiterChecker().check(t.split(bytes([PAD]), 1)[0].decode("utf-8", errors="replace"), a)
        for t, a in zip(texts, answers)]))


def _before_the_end(accepted, texts) -> dict:
    """Accepted drafts per block over the blocks that start before a solution's end
    byte (after it both models agree on PAD), and how many solutions ended."""
    ends = np.array([t.find(bytes([PAD])) for t in texts])
    ended = ends >= 0
    ends = np.where(ended, ends, [len(t) for t in texts])
    starts = np.cumsum(accepted + 1, axis=1) - (accepted + 1)
    live = starts < ends[:, None]
    return {"accepted_per_block": round(float(accepted[live].mean()), 3),
            "blocks_before_the_end": int(live.sum()), "ended": int(ended.sum())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--test", type=int, default=300, help="test problems")
    ap.add_argument("--json", action="store_true", help="the JSON document on stdout")
    a = ap.parse_args(argv)
    out = figures(a.seed, a.test)
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"build: {out['build_s']} s")
    for name in ("target", "draft"):
        r = out[name]
        print(f"{name}: greedy accuracy {r['accuracy']:.3f} ({r['correct']}/{r['problems']}), "
              f"{r['mean_bytes']} bytes per problem, {r['unfinished']} unfinished, "
              f"{r['seconds']} s")
    s = out["standard_rule"]
    print(f"standard rule: {s['accepted_per_block']} of {s['block_size']} drafts accepted per "
          f"block before the end ({s['blocks_before_the_end']} blocks of {s['prompts']} "
          f"prompts, {s['ended']} ended within {s['blocks']} blocks; task accuracy "
          f"{s['accuracy']:.3f}; {s['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
