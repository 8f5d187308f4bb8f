"""The KV caches kept across blocks (evolve.data.sources.hf.cache): every logit the
cached reads give equals an uncached forward pass of the same model over the row's
history alone, after rollbacks (rejected drafts left as holes) and with left-padded
prompts of different lengths, for GPT-2 and a Llama-style model (float64 weights, so
the two computations agree to rounding).

Guarantee 31 of docs/reliability.md, Hugging Face decoding keeps its caches and stays exact:

`evolve data trace --backend hf` and `simulate --compare` on hf traces decode with
both models' KV caches kept across blocks (`evolve/data/sources/hf/cache.py`): the
drafts after a rejection stay in both caches as holes (attention mask 0, position
ids counting only kept tokens), so rows that accepted different counts share one
cache length and nothing is re-read. Every logit the cached reads give equals an
uncached forward pass over the row's history alone, to 1e-9 with float64 weights,
for GPT-2 and a Llama-style model, through blocks where rows accept none, all and
some drafts and with left-padded prompts of 1 to 9 tokens
(`test_cached_logits_are_an_uncached_forward_of_the_history[gpt2|llama]`,
`test_settle_makes_rejected_drafts_holes_and_advances_positions`). Only the model's
cache argument is used (`past_key_values`, or `cache` where the release names it so,
read from the signature); the decoder calls no cache method, so no release-specific
cache API is relied on. The free-running TV estimate of a rule that reads the
lookahead inputs (`evolve/data/sources/hf/lookahead.py`) repeats a history's cache
for its continuations with `batch_repeat_interleave` where the release's cache has it
and reads every continuation with the whole history where not; both give an uncached
forward pass of each continuation
(`test_continuations_after_a_history_are_an_uncached_forward[gpt2|llama]`). These
tests and the recording and free-running tests pass with transformers 4.56.2, 5.17.0
and 5.24.0. Everything per position (softmax at the
temperature in float64, inverse-CDF sampling with the same pre-drawn uniforms in the
same order, candidates and tail masses, entropies, the slot features, the rejection
residual with `RESIDUAL_EPS`, a rule's acceptance and the tracked distortion) runs
on the models' device and is held to its numpy definition in `evolve/data/decode.py`
and `evolve/data/emission.py` (`tests/test_hf_device.py`). Same seed, device, dtype
and batch size: byte-identical files
(`test_same_seed_same_files_another_seed_others`). Recording and free-running show
drafted tokens/s and the ETA: a rich bar on a terminal, a plain line at most every
10 s otherwise, on stderr only.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from evolve.data.sources.hf.cache import Cached, Layout  # noqa: E402

VOCAB, G, BLOCKS = 64, 3, 5
TOL = 1e-9             # float64 weights: cached and uncached differ by rounding only


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=128, n_layer=2, n_embd=32,
                                  n_head=2, initializer_range=0.3)
    return transformers.GPT2LMHeadModel(cfg).double().eval()


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128,
                                   initializer_range=0.3)
    return transformers.LlamaForCausalLM(cfg).double().eval()


def _uncached(model, lay, row, col):
    """Logits at column ``col`` of ``row`` from one pass over its history alone."""
    keep = lay.mask[row, :col + 1].bool()
    ids = lay.ids[row, :col + 1][keep][None]
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits[0, -1]


def _check(model, lay, logits, end, keep):
    worst = 0.0
    for row in range(lay.ids.shape[0]):
        for i, col in enumerate(range(end - keep, end)):
            if not lay.mask[row, col]:       # a hole's own logits are never used
                continue
            want = _uncached(model, lay, row, col)
            worst = max(worst, float((logits[row, i] - want).abs().max()))
    return worst


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_cached_logits_are_an_uncached_forward_of_the_history(build):
    model = build()
    rng = np.random.default_rng(0)
    # left padding; the 1-token prompt's row has nothing to prefill
    prompts = [rng.integers(0, VOCAB, n) for n in (6, 1, 9, 3)]
    lay = Layout(prompts, BLOCKS, G, "cpu")
    draft, target = Cached(model), Cached(model)        # one model, read both ways
    worst = 0.0
    with torch.no_grad():
        draft.prefill(lay)
        target.prefill(lay)
        for t in range(BLOCKS):
            lay.open_block()
            for _ in range(G):                          # the draft: one column per step
                end = lay.cols
                keep = end - draft.cols                 # 2 columns after the first block
                out = draft.read(lay, end, keep)
                worst = max(worst, _check(model, lay, out, end, keep))
                lay.append(torch.from_numpy(rng.integers(0, VOCAB, 4)))
            out = target.read(lay, lay.cols, G + 1)     # the target: the block at once
            worst = max(worst, _check(model, lay, out, lay.cols, G + 1))
            # rows accept different counts: none, all, and in between
            n_acc = torch.tensor([0, G, 1, (t % G)])
            lay.settle(n_acc, torch.from_numpy(rng.integers(0, VOCAB, 4)))
    assert worst < TOL, worst
    # the holes are there: 4 rows, 5 blocks, some drafts rejected in each
    assert int(lay.mask[:, :lay.cols].sum()) < 4 * lay.cols


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_rows_dropped_from_the_cache_read_on_as_an_uncached_forward(build):
    """The label miner's continuations (one column a step) drop rows that have ended
    (``Cached.select`` and ``Layout.select``): the rows kept read on as an uncached
    forward pass of their own history, after one drop and after another."""
    model = build()
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, n) for n in (5, 2, 8, 3, 1)]
    lay = Layout(prompts, 8, 0, "cpu")
    cached = Cached(model)
    worst, rows = 0.0, 5
    with torch.no_grad():
        cached.prefill(lay)
        lay.open_block()
        for step, keep in enumerate(([0, 1, 2, 3, 4], [0, 2, 3, 4], [0, 2, 3, 4], [1, 3],
                                     [0, 1])):
            if step:
                if len(keep) < rows:
                    sel = torch.tensor(keep)
                    assert cached.select(sel)
                    lay.select(sel)
                    rows = len(keep)
                lay.append(torch.from_numpy(rng.integers(0, VOCAB, rows)))
            out = cached.read(lay, lay.cols, 1)
            assert out.shape[0] == rows == lay.ids.shape[0]
            worst = max(worst, _check(model, lay, out, lay.cols, 1))
    assert worst < TOL, worst


def test_settle_makes_rejected_drafts_holes_and_advances_positions():
    lay = Layout([np.array([5, 6, 7]), np.array([9])], 2, G, "cpu")
    assert lay.cols == 2 and lay.mask[:, :2].tolist() == [[1, 1], [0, 0]]
    lay.open_block()
    for x in (1, 2, 3):
        lay.append(torch.tensor([x, x]))
    assert lay.pos[:, 2:6].tolist() == [[2, 3, 4, 5], [0, 1, 2, 3]]
    lay.settle(torch.tensor([1, 3]), torch.tensor([40, 41]))
    assert lay.mask[:, 2:6].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    lay.open_block()
    assert lay.ids[:, 6].tolist() == [40, 41] and lay.pos[:, 6].tolist() == [4, 4]


def test_llama_pair_recording_is_a_direct_forward_pass_of_each_context():
    """The whole recorder on a Llama-style pair (float64 weights): every recorded p(x)
    and q(x) equals the softmax of an uncached pass over the row's recorded context,
    prompts of different lengths in one batch, across rejections."""
    from evolve.data.sources.hf import decode as hf_decode
    from evolve.data.sources.hf import HFTraceConfig
    from evolve.data.sources.hf.models import HFPair, describe_model
    target, draft = _llama(), _gpt2()            # any two causal LMs of one vocabulary
    blocks, n = 4, 5
    cfg = HFTraceConfig(target="t", draft="d", block_size=G, top_k=4, context_len=64,
                        blocks_per_prompt=blocks, batch_size=n)
    pair = HFPair(target, draft, None, VOCAB, "cpu", cfg,
                  {"target": describe_model("t", target), "draft": describe_model("d", draft)})
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, VOCAB, m) for m in (2, 7, 4, 11, 1)]
    rngs = [np.random.default_rng([1, i]) for i in range(n)]
    cols, acc = hf_decode.decode(pair, prompts, rngs, blocks)
    assert 0 < acc.mean() < G                        # rejections happened, and acceptances
    for model, field in ((target, "target_prob"), (draft, "draft_prob")):
        for r in range(len(cols["token"])):
            ctx = cols["context"][r]
            ids = torch.tensor(ctx[ctx >= 0], dtype=torch.long)[None]
            with torch.no_grad():
                logits = model(input_ids=ids, use_cache=False).logits[0, -1]
            want = torch.softmax(logits, -1)[cols["token"][r]].item()
            assert abs(cols[field][r] - want) < TOL, (field, r)


def test_continuations_read_at_once_keep_the_repeated_cache_within_its_budget():
    """SmolLM2-135M's shape (30 layers, 3 key-value heads of 64) after a 200-token
    history: 9.2 MB of keys and values per continuation, so 58 within 512 MiB, not the
    512 (4.7 GB) that a fixed count would repeat; GPT-2's names are read too."""
    from types import SimpleNamespace
    from evolve.data.sources.hf import lookahead as HL
    llama = SimpleNamespace(config=SimpleNamespace(
        num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576))
    assert HL.rows_per_read(llama, 200) == (512 << 20) // (2 * 30 * 3 * 64 * 4 * 200) == 58
    assert HL.rows_per_read(llama, 1) == HL.MAX_ROWS
    gpt2 = SimpleNamespace(config=SimpleNamespace(n_layer=2, n_head=2, n_embd=64))
    assert HL.rows_per_read(gpt2, 4000) == (512 << 20) // (2 * 2 * 2 * 32 * 4 * 4000) == 131
    assert HL.rows_per_read(gpt2, 10 ** 7) == 1                # at least one


@pytest.mark.parametrize("build", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_continuations_after_a_history_are_an_uncached_forward(build, monkeypatch):
    from types import SimpleNamespace
    from evolve.data.sources.hf import device as DV
    from evolve.data.sources.hf import lookahead as HL
    from evolve.data.sources.hf.lookahead import History
    model = build()
    pair = SimpleNamespace(target=model, draft=model, vocab=VOCAB, device="cpu",
                           config=SimpleNamespace(temperature=1.0))
    rng = np.random.default_rng(1)
    history = rng.integers(0, VOCAB, 7)
    rows = rng.integers(0, VOCAB, (5, 3))
    rows[1] = rows[0]                                   # a repeated continuation
    want = np.stack([DV.probs(model(input_ids=torch.from_numpy(
        np.concatenate([history, r]))[None], use_cache=False).logits[0, -1].detach(),
        VOCAB, 1.0).numpy() for r in rows])
    for repeat, cache_bytes in ((True, HL.CACHE_BYTES), (False, HL.CACHE_BYTES), (True, 1)):
        # a cache budget of one byte: one continuation per read, the kept cache copied
        # for each (the history's cache is not consumed by a read)
        monkeypatch.setattr(HL, "CACHE_BYTES", cache_bytes)
        if cache_bytes == 1:
            assert HL.rows_per_read(model, 10) == 1
        h = History(pair, history, repeat_cache=repeat)
        for _ in range(2):                              # the kept cache read twice
            P, Q = h.after(rows)
            assert np.abs(P - want).max() < TOL and np.abs(Q - want).max() < TOL, repeat
    # the history's own positions: slot i of a block starting at 4 predicts token 4 + i
    P, Q = History(pair, history).slots(4, 2)
    for i in range(3):
        got = DV.probs(model(input_ids=torch.from_numpy(history[:4 + i])[None],
                             use_cache=False).logits[0, -1].detach(), VOCAB, 1.0).numpy()
        assert np.abs(P[i] - got).max() < TOL
