"""How fast the Hugging Face decoder runs, against a minimal KV-cached loop of the same models.

A script of the source checkout, not part of the ``evolve`` package::

    python -m benchmarks.speed.hf_speed [--smoke] [--json] [--lengths 64,1024] [--batch B]
                                  [--blocks N] [--device cpu|cuda] [--repeats R]
                                  [--threads T] [--pair DIR]

For each prompt length, on random-init models of fixed shapes (no download),
in one run:

- ``minimal``: a draft/verify loop with KV caches and no host work at all: the
  draft proposes g tokens greedily (argmax on the device), the target verifies
  them in one pass, every draft is kept; the speed no decoder can beat with
  these models and shapes;
- ``record``: ``evolve.data.sources.hf.decode.decode`` recording traces (the
  standard rule, every column of schema v3, top-k 16, no contexts);
- ``free``: the same decoder free-running with a rule (``leniency:0.5``), no
  recording, no distortion tracking;
- ``free+track``: the same with the exact distortion of every reached slot
  tracked, as ``evolve simulate --compare`` runs it.

Each is run ``--repeats`` times (default 3), interleaved, and the best time
kept (the first run of each warms up); on CPU with one torch thread unless
``--threads`` says otherwise (on a shared machine more threads than free cores
can make a run ten times slower). Each is timed twice: ``total`` (prefill,
every block, and the end-of-batch host work) and ``steady`` (from the end of
the first block to the end of the last: the cost of a block once the prompt is
read). Figures are drafted tokens per
second (prompts x blocks x g / seconds), the ratio to ``minimal`` of the same
length, and the steady cost per drafted token at the longest length over the
shortest. Shapes: on CPU a GPT-2 pair (target 6 layers x 256, draft 1 x 64,
byte vocabulary of 256, float32, batch 16, 16 blocks of g = 4); on CUDA
(``torch.cuda.is_available()``) TinyLlama-1.1B-like and Llama-68M-like shapes
(vocabulary 32,000, bf16, batch 32, 16 blocks of g = 4). ``--pair DIR``: a real
pair instead, the models of ``DIR/target`` and ``DIR/draft`` as saved (``evolve data pair
smollm2 --out DIR``: SmolLM2-135M-Instruct and its 8-layer draft, float32). ``--smoke``:
tiny models and sizes, checks only that everything runs.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


G, TOP_K = 4, 16


def build_models(kind: str, device: str, max_len: int):
    """(target, draft) of random-init models of ``kind`` on ``device``, in eval mode (made
    on the device itself: a 1.1B-parameter model initialises there in seconds)."""
    import torch
    torch.manual_seed(0)
    with torch.device(device):
        return _models(kind, device, max_len)


def _models(kind: str, device: str, max_len: int):
    import torch
    import transformers as tf
    if kind == "llama":
        dtype = torch.bfloat16
        common = dict(vocab_size=32000, max_position_embeddings=max_len)
        target = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=2048, intermediate_size=5632,
                                                    num_hidden_layers=22, num_attention_heads=32,
                                                    num_key_value_heads=4, **common))
        draft = tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=768, intermediate_size=3072,
                                                   num_hidden_layers=2, num_attention_heads=12,
                                                   num_key_value_heads=12, **common))
    else:
        dtype = torch.float32
        dims = {"gpt2": ((6, 256, 4), (1, 64, 2)), "smoke": ((2, 64, 2), (1, 32, 2))}[kind]
        target, draft = (tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=256, n_positions=max_len, n_layer=L, n_embd=E, n_head=H,
            initializer_range=0.15, bos_token_id=0, eos_token_id=0)) for L, E, H in dims)
    return (target.to(device=device, dtype=dtype).eval(),
            draft.to(device=device, dtype=dtype).eval())


def load_models(folder, device: str):
    """(target, draft) saved under ``folder/target`` and ``folder/draft``, in eval mode."""
    from pathlib import Path
    from transformers import AutoModelForCausalLM
    return tuple(AutoModelForCausalLM.from_pretrained(Path(folder) / name).to(device).eval()
                 for name in ("target", "draft"))


def make_pair(target, draft, device: str, batch: int, blocks: int):
    from evolve.data.sources.hf import HFTraceConfig
    from evolve.data.sources.hf.models import HFPair, describe_model, logits_size
    cfg = HFTraceConfig(target="random-init", draft="random-init", block_size=G, top_k=TOP_K,
                        blocks_per_prompt=blocks, batch_size=batch, device=device)
    info = {"target": describe_model("target", target), "draft": describe_model("draft", draft)}
    return HFPair(target, draft, None, min(logits_size(target), logits_size(draft)), device,
                  cfg, info)


def _sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def minimal_loop(pair, prompts: np.ndarray, blocks: int, marks: list) -> None:
    """Greedy draft/verify with KV caches, everything kept, nothing on the host."""
    import torch
    from evolve.data.sources.hf.cache import Cached
    arg = Cached(pair.draft).arg
    dev = pair.device
    ids = torch.from_numpy(prompts).to(dev)
    with torch.no_grad():
        d = pair.draft(input_ids=ids[:, :-1], use_cache=True)
        t = pair.target(input_ids=ids[:, :-1], use_cache=True)
        dc, tc = getattr(d, arg), getattr(t, arg)
        last = ids[:, -1:]
        carry = None                      # the draft's unread last draft of the block before
        for _ in range(blocks):
            x = last if carry is None else torch.cat([carry, last], dim=1)
            block = [last]
            for _ in range(G):
                out = pair.draft(input_ids=x, use_cache=True, logits_to_keep=1, **{arg: dc})
                dc = getattr(out, arg)
                x = out.logits[:, -1].argmax(dim=-1, keepdim=True)
                block.append(x)
            carry = x
            out = pair.target(input_ids=torch.cat(block, dim=1), use_cache=True,
                              logits_to_keep=G + 1, **{arg: tc})
            tc = getattr(out, arg)
            last = out.logits[:, -1].argmax(dim=-1, keepdim=True)
            _sync(dev)
            marks.append(time.perf_counter())


def timed(fn, device):
    """(total seconds, steady seconds) of fn(marks): marks gets a time after each block."""
    marks: list = []
    _sync(device)
    t0 = time.perf_counter()
    fn(marks)
    _sync(device)
    total = time.perf_counter() - t0
    return total, (marks[-1] - marks[0]) if len(marks) > 1 else total


def measure(pair, length: int, blocks: int, repeats: int, seed: int = 0) -> dict:
    from evolve.data.sources.hf import decode as hf_decode
    from evolve.rules.adapters import named_rule
    B, dev = pair.config.batch_size, pair.device
    rng = np.random.default_rng([seed, length])
    prompts = rng.integers(0, pair.vocab, (B, length))
    lenient = named_rule("leniency", 0.5)[0]

    def run_decoder(**kw):
        def fn(marks):
            rngs = [np.random.default_rng([seed, i]) for i in range(B)]
            hf_decode.decode(pair, list(prompts), rngs, blocks,
                             progress=lambda n: (_sync(dev), marks.append(time.perf_counter())),
                             **kw)
        return fn

    cases = {"minimal": lambda marks: minimal_loop(pair, prompts, blocks, marks),
             "record": run_decoder(record=True),
             "free": run_decoder(record=False, rule=lenient),
             "free+track": run_decoder(record=False, rule=lenient, track=True)}
    drafted = B * blocks * G
    best = {name: [np.inf, np.inf] for name in cases}
    for _ in range(repeats):          # interleaved, the best of each: load spikes hit all alike
        for name, fn in cases.items():
            best[name] = np.minimum(best[name], timed(fn, dev))
    out = {name: {"total_tokens_per_s": drafted / total,
                  "steady_tokens_per_s": B * (blocks - 1) * G / steady}
           for name, (total, steady) in best.items()}
    for name in cases:
        for f in ("total", "steady"):
            out[name][f"{f}_vs_minimal"] = (out[name][f"{f}_tokens_per_s"]
                                            / out["minimal"][f"{f}_tokens_per_s"])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny models and sizes")
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    ap.add_argument("--lengths", default=None, help="prompt lengths (default 64,1024)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each, the best kept")
    ap.add_argument("--pair", default=None, metavar="DIR",
                    help="the models of DIR/target and DIR/draft (a real pair) instead of "
                         "random-init ones")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads (default on CPU: 1, steady on a shared machine)")
    a = ap.parse_args(argv)
    import torch
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.threads or device == "cpu":
        torch.set_num_threads(a.threads or 1)
    kind = "smoke" if a.smoke else ("llama" if device == "cuda" else "gpt2")
    if a.pair:
        kind = str(a.pair)
    lengths = [int(x) for x in (a.lengths or ("8,32" if a.smoke else "64,1024")).split(",")]
    batch = a.batch or (4 if a.smoke else (32 if device == "cuda" else 16))
    blocks = 3 if a.smoke and a.blocks == 16 else a.blocks
    target, draft = (load_models(a.pair, device) if a.pair else
                     build_models(kind, device, max(lengths) + blocks * (G + 1) + 8))
    pair = make_pair(target, draft, device, batch, blocks)
    doc = {"device": device, "models": kind, "batch": batch, "blocks": blocks, "g": G,
           "top_k": TOP_K, "torch_threads": torch.get_num_threads(), "lengths": {}}
    for L in lengths:
        doc["lengths"][str(L)] = measure(pair, L, blocks, 1 if a.smoke else a.repeats)
    first, last = (doc["lengths"][str(x)] for x in (lengths[0], lengths[-1]))
    doc["steady_cost_ratio_longest_vs_shortest"] = {
        name: first[name]["steady_tokens_per_s"] / last[name]["steady_tokens_per_s"]
        for name in first}
    if a.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{device}, {kind} pair, batch {batch}, {blocks} blocks of g = {G}, top-k {TOP_K}, "
          f"{doc['torch_threads']} torch threads; drafted tokens/s (x minimal)")
    print(f"{'prompt':>7} {'decoder':<11} {'total':>16} {'steady':>16}")
    for L, res in doc["lengths"].items():
        for name, r in res.items():
            print(f"{L:>7} {name:<11} {r['total_tokens_per_s']:>9,.0f} "
                  f"({r['total_vs_minimal']:4.2f}) {r['steady_tokens_per_s']:>9,.0f} "
                  f"({r['steady_vs_minimal']:4.2f})")
    ratios = ", ".join(f"{k} {v:.2f}"
                       for k, v in doc["steady_cost_ratio_longest_vs_shortest"].items())
    print(f"steady cost per drafted token, {lengths[-1]} vs {lengths[0]} tokens: {ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
