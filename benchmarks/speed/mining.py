"""What label mining costs on the built-in task, before and after reuse, against a
minimal continuation loop of the same target.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.mining [--problems N] [--modes greedy,sample] [--repeats R]
                                      [--json FILE] [--smoke]

For each decoding, the traces of the first ``--problems`` valid problems of the
built-in arithmetic task (``evolve data task``'s pair, 1,000 / 300 / 300 problems) are
recorded once, then mined, in one run:

- ``first miner``: the miner as it was first written (``tests/naive_labels.py``: both
  texts of every labelled row computed in full, batches of 2,048 rows);
- ``no reuse``: ``evolve.data.labels.mine(reuse=False)`` (both texts of every row,
  batches sized to memory, the next token chosen where the probabilities are);
- ``reuse``: ``evolve.data.labels.mine``, each distinct continuation once and none the
  recording holds (``evolve.data.label_plan``);
- ``minimal loop``: the target alone continuing exactly the histories ``reuse``
  continued, as far as each went, batched (its probabilities, the argmax or the
  inverse-CDF draw, the token appended), with no text, end or budget checked: the
  time no miner of these rows can beat.

Figures: target rows read (rows x positions), seconds of this process's CPU time
(``time.process_time``: on a shared machine, wall time moves with the other jobs;
everything here runs on one thread), rows per second, and the ratios (rows against
the first miner's, seconds against the minimal loop's), all from the same run, each
with a fresh target (the built-in target keeps caches of the grammar's lines; none
starts warm from another's run) and the best of ``--repeats`` runs, interleaved; the three miners' labels are compared bit for bit. The built-in
target's rows do not cost the same: a history on the grammar's path is read by prefix
matching, one off it (a substituted draft's) by edit distances, so seconds fall less
than rows when reuse removes on-path rows. ``--smoke``: 3 problems, checks that
everything runs.

``device_section`` is the mining section of ``benchmarks/speed/gpu_check.py``: a Hugging
Face pair's continuations on a device, at the built-in task's size and at a 7B shape.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def minimal_loop(pair, cols, greedy: bool, u, texts_of_chains: dict, chains: list):
    """(target rows, seconds) of the target continuing the chains' histories batched, each
    for as many tokens as it generated in mining, with nothing else done."""
    from evolve.data.decode import sample_rows
    todo = [i for i in texts_of_chains if texts_of_chains[i]]
    if not todo:
        return 0, 0.0
    C = pair.context_len
    hists = [np.concatenate([np.asarray(cols["context"][chains[i].row]),
                             np.asarray(chains[i].extra, dtype=cols["context"].dtype)])
             for i in todo]
    steps = np.array([len(texts_of_chains[i]) for i in todo])
    L = max(h.size for h in hists)
    buf = np.full((len(todo), L + int(steps.max())), pair.pad, dtype=hists[0].dtype)
    for b, h in enumerate(hists):
        buf[b, L - h.size:L] = h
    uu = None if greedy else np.stack([u[chains[i].uniform] for i in todo])
    rows = 0
    t0 = time.process_time()
    for s in range(int(steps.max())):
        live = np.flatnonzero(steps > s)
        P = pair.target.probs(buf[live, L + s - C:L + s])
        buf[live, L + s] = (np.argmax(P, axis=1) if greedy
                            else sample_rows(P, uu[live, s]))
        rows += live.size
    return rows, time.process_time() - t0


def fresh(pair):
    """The pair with a new target of the same settings: its caches of the grammar's lines
    start empty, so no miner reads what another one's reads left there."""
    from dataclasses import replace

    from evolve.data.sources.task.target import GrammarTarget
    return replace(pair, target=GrammarTarget(pair.target.temperature, pair.target.floor))


def measure(pair, mode: str, problems: int, repeats: int) -> dict:
    """Every miner and the minimal loop on one recording, each with a fresh target, best
    of ``repeats`` (interleaved)."""
    from evolve.data import label_plan as LP
    from evolve.data import labels as LB
    from evolve.data.sources.task import record
    sys.path.insert(0, str(ROOT))
    from tests import naive_labels
    greedy = mode == "greedy"
    ts = record.record_traces(pair, "valid", mode, problems)
    cols, max_new = ts.columns, pair.max_new("valid")
    out = {"mode": mode, "problems": problems, "drafted_rows": len(ts)}
    rows_ = np.flatnonzero(LB.could_reject(cols, greedy))
    u = None if greedy else LB.row_uniforms(0, np.arange(rows_.size), max_new + 1)

    def first_miner():
        p = fresh(pair)
        t = time.process_time()
        labels, rows, calls, _ = naive_labels.mine(p, cols, p.answer_of, p.done_of, greedy,
                                                   max_new, 0, pad=p.pad)
        return labels, {"rows": int(rows), "calls": int(calls),
                        "seconds": time.process_time() - t}

    def miner(reuse):
        def go():
            p = fresh(pair)
            t = time.process_time()
            labels, cost = LB.mine(p, cols, p.answer_of, p.done_of, greedy, max_new, 0,
                                   pad=p.pad, reuse=reuse)
            return labels, {"rows": cost["target_forward_rows"],
                            "calls": cost["target_forward_passes"],
                            "seconds": time.process_time() - t,
                            "continuations_computed": cost["continuations_computed"],
                            "continuations_needed": cost["continuations_needed"]}
        return go

    def minimal():
        # the chains reuse computes, and how far each went (not timed), then the loop
        p = fresh(pair)
        run = LP.Runner(p, cols, greedy, p.done_of, p.pad)
        draws = cols["target_top"][rows_] if greedy else run.first_tokens(rows_, u[:, 0])
        plan = LP.plan(cols, rows_, draws, greedy, True)
        run.texts(plan, np.full(rows_.size, max_new), None if u is None else u[:, 1:])
        p = fresh(pair)
        r, s = minimal_loop(p, cols, greedy, None if u is None else u[:, 1:],
                            run.last_chains, plan.chains)
        if not greedy:          # the own draws: one row each, read as mining reads them
            t = time.process_time()
            p.target.probs(np.asarray(cols["context"][rows_])[:, -p.context_len:])
            s += time.process_time() - t
            r += rows_.size
        return None, {"rows": int(r), "seconds": s}

    runs = {"first miner": first_miner, "no reuse": miner(False), "reuse": miner(True),
            "minimal loop": minimal}
    first = None
    for _ in range(repeats):
        for name, fn in runs.items():
            labels, m = fn()
            if name == "first miner":
                first = labels
            elif labels is not None:
                m["identical"] = bool(np.array_equal(labels, first))
            if name not in out or m["seconds"] < out[name]["seconds"]:
                out[name] = m
    out["labelled"] = int((first >= 0).sum())
    out["critical"] = int((first == 1).sum())
    return out


# ------------------------------------------------------------ on a device (gpu_check)

# model shapes of the device section: a byte-level model at the built-in task's lengths
# (a GPT-2 of 6 x 256, vocabulary 256, float32), a Qwen2.5-7B-like shape (28 layers x
# 3,584, 28 heads with 4 key/value heads, MLP 18,944, vocabulary 152,064, bf16; random
# weights), and a tiny one for --smoke
SHAPES = {
    "smoke": dict(kind="gpt2", layers=2, hidden=64, heads=2, vocab=256, prompt=12, steps=6,
                  batch=6),
    "builtin": dict(kind="gpt2", layers=6, hidden=256, heads=4, vocab=256, prompt=128,
                    steps=64, batch=2048),
    "7b": dict(kind="llama", layers=28, hidden=3584, heads=28, kv_heads=4, inner=18944,
               vocab=152064, prompt=256, steps=64, batch=1024),
}


def device_model(shape: dict, device: str):
    """A random-init causal LM of ``shape`` on ``device``, in eval mode (made on the
    device itself)."""
    import torch
    import transformers as tf
    torch.manual_seed(0)
    n = shape["prompt"] + shape["steps"] + 8
    with torch.device(device):
        if shape["kind"] == "llama":
            m = tf.LlamaForCausalLM(tf.LlamaConfig(
                vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                intermediate_size=shape["inner"], num_hidden_layers=shape["layers"],
                num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
                max_position_embeddings=n, torch_dtype=torch.bfloat16))
            m = m.to(torch.bfloat16)
        else:
            m = tf.GPT2LMHeadModel(tf.GPT2Config(
                vocab_size=shape["vocab"], n_positions=n, n_layer=shape["layers"],
                n_embd=shape["hidden"], n_head=shape["heads"], initializer_range=0.15,
                bos_token_id=0, eos_token_id=0))
    return m.eval()


def device_mining(model, shape: dict, device: str, max_memory: int | None = None,
                  seed: int = 0) -> dict:
    """The label miner's continuations (``labels.continue_text`` through a Hugging Face
    pair's ``continuation_reader``: KV cache, the argmax on the device, ended rows dropped)
    of a batch of random prompts, each row ending after its own number of steps (a
    quarter to all of ``steps``), against a minimal KV-cached greedy loop of the same
    model over the same batch for ``steps`` steps (every row every step, nothing on the
    host). The batch is what ``max_memory`` bytes hold by ``hf_pair.row_bytes`` (default:
    half the free device memory, as mining takes), at most ``shape["batch"]``. Figures:
    rows per second (a row: one position of one continuation), the rows the minimal loop
    computes beyond those needed, and on a GPU the peak memory mining took beyond the
    model against the estimate."""
    import functools
    from types import SimpleNamespace

    import torch
    from evolve.data import labels as LB
    from evolve.data.sources.hf.cache import Cached, Layout
    from evolve.data.sources.task import hf_pair as HT
    L, S = shape["prompt"], shape["steps"]
    est = HT.row_bytes(HT.model_shape(model), L, S)
    memory = max_memory if max_memory is not None else HT.free_memory(device) // 2
    B = int(max(1, min(shape["batch"], memory // est)))
    rng = np.random.default_rng(seed)
    hist = rng.integers(1, shape["vocab"], (B, L)).astype(np.int64)
    limits = rng.integers(max(1, S // 4), S + 1, B)
    view = HT.ModelView(model, shape["vocab"], 1.0, device, "random-init", {})
    pair = SimpleNamespace(target=view, vocab=shape["vocab"], context_len=L + S)
    pair.continuation_reader = functools.partial(HT.HFTaskPair.continuation_reader, pair)
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize()) if cuda else (lambda: None)

    def mine():
        return LB.continue_text(pair, hist, True, None, lambda t: False, limits, -1, None)

    def minimal():
        lay = Layout([h for h in hist], S, 0, device)
        m = Cached(model)
        with torch.inference_mode():
            m.prefill(lay)
            lay.open_block()
            x = None
            for step in range(S):
                if step:
                    lay.append(x)
                x = m.read(lay, lay.cols, 1)[:, -1].argmax(dim=-1)
        return x

    out = {"shape": {k: v for k, v in shape.items() if k != "batch"}, "batch": B,
           "device": device, "estimate_bytes_per_row": est,
           "rows_needed": int(limits.sum()), "rows_minimal": B * S}
    for name, fn in (("warm", minimal), ("minimal", minimal), ("mining", mine)):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync()
        t = time.perf_counter()
        got = fn()
        sync()
        sec = time.perf_counter() - t
        if name == "warm":
            continue
        out[f"{name}_seconds"] = sec
        if cuda:
            out[f"{name}_peak_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        if name == "mining":
            _, rows, calls = got
            assert rows == out["rows_needed"], (rows, out["rows_needed"])
            out["mining_calls"] = calls
    out["mining_rows_per_s"] = out["rows_needed"] / out["mining_seconds"]
    out["minimal_rows_per_s"] = out["rows_minimal"] / out["minimal_seconds"]
    out["minimal_needed_rows_per_s"] = out["rows_needed"] / out["minimal_seconds"]
    out["mining_vs_minimal"] = out["minimal_seconds"] / out["mining_seconds"]
    if cuda:
        out["estimate_bytes"] = est * B
        out["mining_peak_vs_estimate"] = out["mining_peak_bytes"] / (est * B)
    return out


def device_section(device: str, smoke: bool) -> dict:
    """``device_mining`` at the built-in task's size and at a 7B shape (``smoke``: the
    tiny shape alone), each model made and freed in turn."""
    import gc

    import torch
    out = {}
    for name in (("smoke",) if smoke else ("builtin", "7b")):
        model = device_model(SHAPES[name], device)
        out[name] = device_mining(model, SHAPES[name], device)
        del model
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return out


def table(results: list) -> str:
    head = ("decoding", "miner", "target rows", "vs first miner", "CPU seconds", "rows/s",
            "vs minimal loop", "labels")
    body = []
    for res in results:
        first = res["first miner"]["rows"]
        bound = res["minimal loop"]["seconds"]
        for name in ("first miner", "no reuse", "reuse", "minimal loop"):
            m = res[name]
            body.append((res["mode"], name, f"{m['rows']:,}", f"{m['rows'] / first:.3f}",
                         f"{m['seconds']:.2f}", f"{m['rows'] / max(m['seconds'], 1e-9):,.0f}",
                         f"{m['seconds'] / max(bound, 1e-9):.2f}x",
                         "" if "identical" not in m else
                         ("identical" if m["identical"] else "DIFFERENT")))
    widths = [max(len(str(r[i])) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(r) for r in body])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", type=int, default=40)
    ap.add_argument("--modes", default="greedy,sample")
    ap.add_argument("--repeats", type=int, default=1,
                    help="best of this many runs of each (interleaved)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    from evolve.data.sources.task import pair as TP
    problems = 3 if args.smoke else args.problems
    t = time.perf_counter()
    pair = TP.build_pair(TP.TaskPairConfig(train_prompts=1000, valid_prompts=300,
                                           test_prompts=300))
    print(f"built-in task pair built ({time.perf_counter() - t:.1f} s); mining the first "
          f"{problems} valid problems", file=sys.stderr)
    results = [measure(pair, mode, problems, args.repeats) for mode in args.modes.split(",")]
    print(table(results))
    for res in results:
        saved = 1 - res["reuse"]["rows"] / res["first miner"]["rows"]
        print(f"{res['mode']}: {res['labelled']:,} labelled drafts ({res['critical']:,} "
              f"critical) of {res['drafted_rows']:,} drafted rows; reuse reads {saved:.1%} "
              f"fewer target rows than the first miner, labels "
              f"{'identical' if res['reuse']['identical'] else 'DIFFERENT'}")
    if args.json:
        args.json.write_text(json.dumps({"results": results}, indent=2) + "\n")
    return 0 if all(r[k]["identical"] for r in results for k in ("reuse", "no reuse")) else 1


if __name__ == "__main__":
    sys.exit(main())
