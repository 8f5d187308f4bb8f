"""Greedy speculative decoding (evolve.data.decode.decode(greedy=True)): with the
standard rule the text is the target's own greedy text, whatever the draft proposes
(lossless); a rule decides the mismatches only; the records' standard decisions are
'the draft is the target's argmax'."""

from __future__ import annotations

import numpy as np
import pytest

from evolve.data import decode as DEC
from evolve.data import traces as T
from evolve.data.sources import ngram as NG
from evolve.lang import treeio
from evolve.rules.adapters import named_rule, tree_rule
from tests import tracekit


def _target_greedy(pair, prompts, n: int) -> np.ndarray:
    """The target alone, argmax byte by byte, ``n`` bytes after each prompt."""
    C = pair.context_len
    hist = prompts.copy()
    for _ in range(n):
        nxt = np.argmax(pair.target.probs(hist[:, -C:]), axis=1).astype(np.uint8)
        hist = np.concatenate([hist, nxt[:, None]], axis=1)
    return hist[:, prompts.shape[1]:]


@pytest.fixture(scope="module")
def setup():
    pair = tracekit.pair()
    prompts, rngs = NG.prompt_starts(pair, "test", 12)
    return pair, prompts, rngs


def _decode(pair, prompts, rule=None, blocks=6):
    rngs = [np.random.default_rng(i) for i in range(len(prompts))]
    return DEC.decode(pair, prompts, rngs, blocks, rule=rule, record=True, history=True,
                      greedy=True)


def test_standard_greedy_speculative_decoding_is_the_targets_greedy_text(setup):
    pair, prompts, _ = setup
    cols, acc, hist, lens = _decode(pair, prompts)
    L0 = prompts.shape[1]
    n = int((lens - L0).min())
    assert n >= 6
    want = _target_greedy(pair, prompts, n)
    np.testing.assert_array_equal(hist[:, L0:L0 + n], want)
    # the draft proposes its argmax
    # the records are schema-valid traces; the greedy decision is token == target_top
    cfg = pair.config
    T.validate(T.TraceSplit(cols, {"block_size": cfg.block_size, "top_k": cfg.top_k,
                                   "context_len": cfg.context_len}, "g"), "greedy")
    assert (cols["draft_prob"] == cols["q_max"]).all()
    assert 0 < acc.mean() < pair.config.block_size       # some kept, some rejected


def test_a_rule_decides_only_the_mismatches(setup):
    pair, prompts, _ = setup
    never = tree_rule(treeio.parse("0.0"), "never")
    cols, acc, hist, lens = _decode(pair, prompts, never)
    base = _decode(pair, prompts)
    np.testing.assert_array_equal(acc, base[1])            # matches are kept regardless
    always = tree_rule(treeio.parse("1.0"), "always")
    _, acc_all, _, _ = _decode(pair, prompts, always)
    assert (acc_all == pair.config.block_size).all()       # every mismatch kept too
    lenient = named_rule("leniency", 0.5)[0]
    _, acc_len, _, _ = _decode(pair, prompts, lenient)
    assert acc_len.sum() >= base[1].sum()


def test_target_only_rules_are_refused_greedy(setup):
    pair, prompts, _ = setup
    with pytest.raises(ValueError, match="standard residual"):
        _decode(pair, prompts, named_rule("sglang_acc", 0.5)[0])


def test_decoding_stops_at_the_end_token(setup):
    """With ``end``, a sequence stops once a block emitted it: its text ends there, its
    later blocks count -1 and their records are not live."""
    pair, prompts, _ = setup
    end = int(_target_greedy(pair, prompts[:1], 5)[0, 4])     # a byte the target writes
    L0 = prompts.shape[1]
    cols, acc, hist, lens = DEC.decode(pair, prompts, [np.random.default_rng(i) for i in
                                                       range(len(prompts))], 8,
                                       record=True, history=True, greedy=True, end=end)
    g = pair.config.block_size
    live = cols["live"].reshape(len(prompts), -1, g)[:, :, 0]
    for i in range(len(prompts)):
        text = hist[i, L0:lens[i]]
        used = int((acc[i] >= 0).sum())
        assert live[i, :used].all() and not live[i, used:].any()
        assert (acc[i, used:] == -1).all()
        if end in text:
            assert text[-1] == end or end in text[len(text) - g - 1:]   # within the last block
            assert int(np.flatnonzero(text == end)[0]) >= len(text) - (acc[i, used - 1] + 1)
    assert (acc == -1).any()                                  # some stopped early
