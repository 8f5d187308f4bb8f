"""What counting the target's ranks costs against sorting each row, on the device.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.ranks [--rows 64] [--vocab 49152] [--columns 1 16]
        [--threads 1] [--repeats 5] [--device cpu]

``evolve.data.sources.hf.device.ranks`` (how many entries of each row of P are above
each value: one pass over the vocabulary per value column) against the reference it
replaced, a sort of each row and a search of it, on the same random distributions
(float64, rows x vocabulary, the values taken from the rows themselves, so ties
occur): the best of ``--repeats`` timed runs each, their ratio, and a check that the
two give the same integers. The default shape is a block of 4 drafts for 16
sequences over SmolLM2's vocabulary; 1 column is ``target_rank``, 16 the recorded
``cand_target_rank`` of a top-16.
"""

from __future__ import annotations

import argparse
import json
import time


def by_sort(P, values):
    import torch
    one = values.dim() == 1
    v = (values.unsqueeze(1) if one else values).to(P.dtype).contiguous()
    S = torch.sort(P, dim=1).values
    out = P.shape[1] - torch.searchsorted(S, v, right=True)
    return out[:, 0] if one else out


def best(fn, repeats: int, sync) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv=None) -> int:
    import torch
    from evolve.data.sources.hf.device import ranks
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--columns", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    P = torch.rand(a.rows, a.vocab, generator=g, dtype=torch.float64)
    P = (P.round(decimals=3) / P.round(decimals=3).sum(dim=1, keepdim=True)).to(dev)
    doc = {"rows": a.rows, "vocab": a.vocab, "threads": a.threads, "device": a.device,
           "columns": {}}
    for T in a.columns:
        idx = torch.randint(0, a.vocab, (a.rows, T), generator=g).to(dev)
        v = torch.gather(P, 1, idx)
        v = v[:, 0] if T == 1 else v
        same = bool(torch.equal(ranks(P, v), by_sort(P, v)))
        count = best(lambda: ranks(P, v), a.repeats, sync)
        sort = best(lambda: by_sort(P, v), a.repeats, sync)
        doc["columns"][T] = {"count_ms": 1e3 * count, "sort_ms": 1e3 * sort,
                             "sort_over_count": sort / count, "same_integers": same}
        print(f"{a.rows} rows x {a.vocab:,} tokens, {T} value column(s): count "
              f"{1e3 * count:.1f} ms, sort {1e3 * sort:.1f} ms ({sort / count:.1f}x); "
              f"same integers: {same}")
    if a.json:
        print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
