"""``evolve simulate --compare``: paired free-running comparison of rules."""

from __future__ import annotations

import time

from evolve.cli import trace_views, views
from evolve.cli.common import fail


def compare_cmd(pair, rules: dict, data_dir, split: str, prompts, blocks, seed: int,
                same_corpus: bool, out, json_mode: bool) -> None:
    from evolve import paired    # lazy: start-up (a command loads only what it runs)
    # lazy: start-up (a command loads only what it runs)
    from evolve.data.sources.registry import source_of_pair
    from evolve.simulate import SizeError    # lazy: start-up (a command loads only what it runs)
    cfg = pair.config
    src = source_of_pair(pair)
    blocks = cfg.blocks_per_prompt if blocks is None else int(blocks)
    # before any decoding: one line, no output
    prompts = src.prepare_comparison(pair, split, prompts, blocks, out.meter)
    prompts = cfg.prompts(split) if prompts is None else int(prompts)
    t0 = time.perf_counter()
    try:        # the sizes again, now that an hf prompts file has given its count
        res = paired.compare(pair, rules, split=split, prompts=prompts, blocks=blocks,
                             seed=seed, progress=out.note)
    except SizeError as e:
        fail(e.cli_message())
    except Exception as e:       # out of memory on the models' device while decoding
        why = src.memory_error(pair, e)
        if why is None:
            raise
        fail(f"--prompts {prompts}, --blocks {blocks}: {why}; use fewer --prompts or "
             "--blocks, or a smaller --batch-size when recording")
    doc = {"data": str(data_dir), "corpus_matches_trace": same_corpus, **res,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        out.print_json(views.jsonable(doc))
        return
    trace_views.show_comparison(doc, out)
