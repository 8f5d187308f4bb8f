"""What one decoding step of each model of a pair costs, timed on this machine.

A decoding step is one new token read after a KV cache of ``context`` tokens, the work
the draft does per drafted token and, to first order, the work of a target call
verifying a short block. The models are timed in turn, step after step, so that both
see the same load; each one's figure is the median of ``reps`` steps. The ratio
draft / target is the draft's cost per token relative to a target call, the ``c`` of
the cost model a call verifying g drafts costs 1 + g c (``evolve tradeoff
--draft-cost``).

These are wall-clock times: they belong to this machine, this load and this batch,
and are reported as measured, never stored in recorded data (whose bits are the same
on every machine).
"""

from __future__ import annotations

import statistics
import time

from evolve.data.sources.hf.cache import call_names


def step_times(models: dict, vocab: int, context: int = 64, reps: int = 20,
               batch: int = 1, seed: int = 0) -> dict:
    """{name: median seconds of one decoding step} for each model of ``models``
    ({name: a transformers causal LM}), all on one device, reading the same random
    token ids (below ``vocab``)."""
    import torch  # lazy: the core install has no torch
    from transformers import DynamicCache  # lazy: as torch

    if context < 1 or reps < 1 or batch < 1:
        raise ValueError(f"context {context}, reps {reps} and batch {batch} must be >= 1")
    first = next(iter(models.values()))
    device = next(first.parameters()).device
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, context), generator=g).to(device)
    nxt = torch.randint(0, vocab, (batch, 1), generator=g).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    caches, times = {}, {r: [] for r in models}
    with torch.inference_mode():
        for r, m in models.items():
            name, _ = call_names(m)
            caches[r] = (name, DynamicCache())
            m(input_ids=ids, use_cache=True, **{name: caches[r][1]})
        for _ in range(reps):                     # the models in turn: the same load
            for r, m in models.items():
                name, cache = caches[r]
                sync()
                t0 = time.perf_counter()
                m(input_ids=nxt, use_cache=True, **{name: cache})
                sync()
                times[r].append(time.perf_counter() - t0)
                cache.crop(-1)                    # the same context every step
    return {r: statistics.median(v) for r, v in times.items()}


def draft_cost(target, draft, vocab: int, context: int = 64, reps: int = 20,
               batch: int = 1) -> dict:
    """The draft's cost per token relative to a target call, as measured here: a dict
    with ``draft_cost`` (the ratio of the medians), ``target_ms``, ``draft_ms`` and how
    it was timed (context, reps, batch, torch threads, device)."""
    import torch  # lazy: as above
    med = step_times({"target": target, "draft": draft}, vocab, context, reps, batch)
    return {"draft_cost": med["draft"] / med["target"],
            "target_ms": 1e3 * med["target"], "draft_ms": 1e3 * med["draft"],
            "context": context, "reps": reps, "batch": batch,
            "threads": torch.get_num_threads(),
            "device": str(next(target.parameters()).device)}
