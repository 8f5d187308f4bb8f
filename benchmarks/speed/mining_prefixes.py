"""What reading shared prefixes once saves in label mining on a Hugging Face task pair.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.mining_prefixes --data TASK_DIR [--split train]
        [--problems 0 1] [--json FILE]

The labels of the problems [lo, hi) of a recorded split (``evolve data task`` on a
Hugging Face pair, e.g. the real pair's ``datasets/pairs/smollm2/results/task/sample``)
are mined twice in one run, as ``evolve data task`` mines them: with the pair reading
each prefix its continuations share once (``evolve.data.sources.hf.cache.prefill_shared``)
and, the reference, reading every history whole. Figures: the seconds of each (wall
time, one process; the models' threads as the pair sets them), their ratio, the target
rows read, and how many labels differ (the two read the same logits to float rounding).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np


def mine(pair, cols, problems, share: bool):
    from evolve.data import labels as LB   # lazy: after the arguments are read
    pair.share_prefixes = share
    t0 = time.perf_counter()
    labels, cost = LB.mine(pair, cols, pair.answer_of, pair.done_of, False, pair.max_new("train"),
                           0, pad=pair.pad, max_tokens=pair.max_tokens, problems=problems)
    return labels, cost, time.perf_counter() - t0


def main(argv=None) -> int:
    from evolve.data import traces as T   # lazy: as above
    from evolve.data.sources.task import pair as TP   # lazy: as above
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="a task recording's folder")
    ap.add_argument("--split", default="train")
    ap.add_argument("--problems", type=int, nargs=2, default=[0, 1], metavar=("LO", "HI"))
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    ts = T.load(a.data / f"{a.split}.npz")
    if ts.meta.get("decoding") != "sample" or (ts.meta.get("task") or {}).get("source") != "hf":
        raise SystemExit(f"{a.data / a.split}.npz: a sampled recording of a Hugging Face task "
                         "pair is needed")
    pair = TP.rebuild(ts.meta)
    problems = tuple(a.problems)
    shared, cost, s_shared = mine(pair, ts.columns, problems, True)
    whole, cost_w, s_whole = mine(pair, ts.columns, problems, False)
    doc = {"command": "python -m benchmarks.speed.mining_prefixes " + " ".join(
               sys.argv[1:] if argv is None else argv),
           "data": str(a.data), "split": a.split, "problems": list(problems),
           "rows": cost["rows"], "seconds": {"shared": round(s_shared, 2),
                                             "whole": round(s_whole, 2)},
           "speedup": round(s_whole / s_shared, 2),
           "target_rows": {"shared": cost["target_forward_rows"],
                           "whole": cost_w["target_forward_rows"]},
           "labels_differing": int((shared != whole).sum()),
           "critical": {"shared": int((shared == 1).sum()), "whole": int((whole == 1).sum())}}
    print(f"{doc['rows']} labelled rows of problems {problems[0]}..{problems[1] - 1}: shared "
          f"prefixes {s_shared:.1f} s, whole histories {s_whole:.1f} s ({doc['speedup']:.2f}x); "
          f"labels differing {doc['labels_differing']} of {doc['rows']}")
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
