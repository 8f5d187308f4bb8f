"""``evolve simulate --compare``: paired free-running comparison of rules."""

from __future__ import annotations

import time

from evolve.cli import trace_views, views


def compare_cmd(pair, rules: dict, data_dir, split: str, prompts, blocks, seed: int,
                same_corpus: bool, out, json_mode: bool) -> None:
    from evolve import paired
    cfg = pair.config
    texts = getattr(pair, "texts", None)            # an hf pair prompted from a file
    if prompts is None:
        prompts = len(texts[split]) if texts is not None else cfg.prompts(split)
    elif texts is not None and prompts > len(texts[split]):
        from evolve.data.tokens import DataError
        raise DataError(f"--prompts: {prompts}; the {split} split of {cfg.prompts_file} has "
                        f"{len(texts[split])} prompts")
    prompts = int(prompts)
    blocks = cfg.blocks_per_prompt if blocks is None else int(blocks)
    t0 = time.perf_counter()
    res = paired.compare(pair, rules, split=split, prompts=prompts, blocks=blocks, seed=seed,
                         progress=out.note)
    doc = {"data": str(data_dir), "corpus_matches_trace": same_corpus, **res,
           "seconds": round(time.perf_counter() - t0, 3)}
    if json_mode:
        out.print_json(views.jsonable(doc))
        return
    trace_views.show_comparison(doc, out)
