"""The SmolLM2 pair's figures (docs/real-pair.md), after `evolve data pair smollm2`.

- ``accuracy``: the target's greedy accuracy on each task kind's test problems (its own
  decoding with its chat template, each answer up to its end-of-text token or
  ``--max-new`` tokens, checked by the kind's ``WordChecker``);
- ``cost``: the draft's cost per token relative to the target's: one decoding step
  (one new token, KV cache of a ``--context``-token prompt, batch 1 and batch 16) timed
  for each model in turn, ``--reps`` times, the median per model;
- ``acceptance``: on traces recorded with `evolve data trace --backend hf` from the
  pair (``--traces DIR``), the standard rule's exact tokens per target call and
  acceptance by block position on each split (``evolve.objectives.spec``);
- the draft's own build record (layers, answers, steps, minutes, held-out argmax
  agreement and mean TV) is read from its ``draft.json``.

    P=datasets/pairs/smollm2
    python -m benchmarks.experiments.smollm2_pair --write-prompts 8
    evolve data trace --backend hf --target $P/target --draft $P/draft \\
        --prompts $P/prompts-quick.jsonl --out $P/traces
    python -m benchmarks.experiments.smollm2_pair --traces $P/traces \\
        --per-kind 16 --json benchmarks/experiments/smollm2_pair.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.common import ROOT  # noqa: E402

from evolve.data.sources.pairs import chat_tasks  # noqa: E402
from evolve.data.sources.task.checker import WordChecker  # noqa: E402
from evolve.data.sources.task.files import read_tasks  # noqa: E402


def accuracy(pair: Path, kinds, per_kind: int | None, max_new: int, batch: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(pair / "target")
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(pair / "target", dtype=torch.float32).eval()
    out = {}
    for kind in kinds:
        problems = read_tasks(pair / "tasks" / f"{kind}.jsonl")
        checker = WordChecker(p.answer for p in problems)
        test = [p for p in problems if p.split == "test"][:per_kind]
        right, t0, wrong = 0, time.perf_counter(), []
        for b in range(0, len(test), batch):
            chunk = test[b:b + batch]
            enc = tok([p.prompt for p in chunk], return_tensors="pt", padding=True)
            with torch.inference_mode():
                gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False,
                                     pad_token_id=tok.eos_token_id)
            for p, row in zip(chunk, gen[:, enc["input_ids"].shape[1]:].tolist()):
                if tok.eos_token_id in row:
                    row = row[:row.index(tok.eos_token_id)]
                text = tok.decode(row, skip_special_tokens=True)
                ok = checker.check(text, p.answer)
                right += ok
                if not ok and len(wrong) < 3:
                    wrong.append({"reference": p.answer, "answer": text[:120]})
        out[kind] = {"problems": len(test), "accuracy": right / max(len(test), 1),
                     "seconds": round(time.perf_counter() - t0, 1), "wrong_examples": wrong}
        print(f"{kind}: {right}/{len(test)} right ({out[kind]['seconds']} s)", flush=True)
    return out


def cost(pair: Path, context: int, reps: int, batches=(1, 16)) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from evolve.data.sources.hf import clock
    models = {r: AutoModelForCausalLM.from_pretrained(pair / r, dtype=torch.float32).eval()
              for r in ("target", "draft")}
    vocab = models["target"].config.vocab_size
    out = {"context": context, "reps": reps, "threads": torch.get_num_threads()}
    for b in batches:
        med = clock.step_times(models, vocab, context, reps, batch=b)
        out[f"batch_{b}"] = {"target_ms": 1e3 * med["target"], "draft_ms": 1e3 * med["draft"],
                             "ratio": med["draft"] / med["target"]}
        print(f"batch {b}: target {1e3 * med['target']:.1f} ms, draft "
              f"{1e3 * med['draft']:.1f} ms a step: cost ratio {out[f'batch_{b}']['ratio']:.3f}",
              flush=True)
    return out


def acceptance(traces_dir: Path) -> dict:
    from evolve.data import traces
    from evolve.objectives import spec
    from evolve.rules import tuning
    out = {}
    for split in ("train", "valid", "test"):
        path = traces_dir / f"{split}.npz"
        if not path.exists():
            continue
        ts = traces.load(path)
        sa = spec.TraceArrays.from_split(ts)
        o = spec.objectives(sa, tuning.thresholds("standard_rejection", sa))
        out[split] = {"blocks": o.n_blocks, "block_size": o.block_size,
                      "tokens_per_call": o.tokens_per_call, "tokens_se": o.tokens_se,
                      "acceptance_by_position": list(o.acceptance)}
        print(f"{split}: {o.n_blocks} blocks of g = {o.block_size}: {o.tokens_per_call:.3f} "
              f"+- {o.tokens_se:.3f} tokens per target call", flush=True)
    return out


def prompts_subset(pair: Path, test: int, out: Path, others: int = 2) -> Path:
    """A prompts file of the pair's first ``test`` test instructions and ``others`` of
    train and of valid (the trace source records all three splits): a quick recording."""
    rows = [json.loads(line) for line in (pair / "prompts.jsonl").read_text().splitlines()]
    keep = ([r for r in rows if r["split"] == "test"][:test]
            + [r for r in rows if r["split"] == "train"][:others]
            + [r for r in rows if r["split"] == "valid"][:others])
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in keep))
    print(f"{out}: {len(keep)} prompts ({test} test)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--pair", type=Path, default=ROOT / "datasets" / "pairs" / "smollm2")
    ap.add_argument("--traces", type=Path, default=None)
    ap.add_argument("--only", nargs="+", default=["accuracy", "cost", "acceptance"],
                    choices=["accuracy", "cost", "acceptance"])
    ap.add_argument("--kinds", nargs="+", default=list(chat_tasks.KINDS))
    ap.add_argument("--per-kind", type=int, default=None, help="test problems per kind")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--write-prompts", type=int, default=None, metavar="N",
                    help="only write PAIR/prompts-quick.jsonl: N test instructions, 2 train, "
                         "2 valid (for a quick `evolve data trace`)")
    args = ap.parse_args(argv)
    if args.write_prompts is not None:
        prompts_subset(args.pair, args.write_prompts, args.pair / "prompts-quick.jsonl")
        return 0
    res = {}
    if args.json and args.json.exists():
        res = json.loads(args.json.read_text())
    res["draft"] = json.loads((args.pair / "draft" / "draft.json").read_text())
    if "accuracy" in args.only:
        res["accuracy"] = {"max_new": args.max_new, "per_kind": args.per_kind,
                           "kinds": accuracy(args.pair, args.kinds, args.per_kind,
                                             args.max_new, args.batch)}
    if "cost" in args.only:
        res["cost"] = cost(args.pair, args.context, args.reps)
    if "acceptance" in args.only and args.traces is not None:
        res["acceptance"] = {"traces": str(args.traces), "splits": acceptance(args.traces)}
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
