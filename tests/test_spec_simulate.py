"""Offline objectives against real speculative decoding with the trained pair."""

import numpy as np
import pytest

from tests import rulefns
from evolve.freerun import simulate as S
from evolve.objectives import spec
from heuristics import baselines as HB
from tests import tracekit

Z_MAX = 4.0    # agreement within this many standard errors


def first_token_lenient(draft_prob, target_prob, position, draft_entropy, target_entropy,
                        top_token_match, block_position, p_max, q_max):
    """Lenient at the first block position only (uses the v2 keyword features)."""
    l = 0.3 if block_position == 0 else 1.0
    return min(1.0, target_prob / (l * draft_prob))


def _first_token_lenient_np(F):
    l = np.where(F["block_position"] == 0, 0.3, 1.0)
    return np.minimum(1.0, F["target_prob"] / (l * F["draft_prob"]))


RULES = [
    ("standard", HB.standard_rejection, rulefns.standard, {}),
    ("leniency", HB.leniency, rulefns.leniency, {"l": 0.5}),
    ("bild", HB.bild_rollback, rulefns.bild, {"alpha": 5.0}),
    ("first_token_lenient", first_token_lenient, _first_token_lenient_np, {}),
]


@pytest.fixture(scope="module")
def world():
    ts = tracekit.split("valid")
    return tracekit.pair(), ts, spec.TraceArrays.from_split(ts)


def test_as_rule_signatures():
    r6 = S.as_rule(HB.leniency)
    r9 = S.as_rule(first_token_lenient)
    assert not r6.extended and r9.extended
    F = {"draft_prob": np.array([0.5, 0.5]), "target_prob": np.array([0.2, 0.2]),
         "position": np.array([3, 3]), "draft_entropy": np.array([1.0, 1.0]),
         "target_entropy": np.array([1.0, 1.0]), "top_token_match": np.array([True, False]),
         "block_position": np.array([0, 1]), "p_max": np.array([0.4, 0.4]),
         "q_max": np.array([0.5, 0.5])}
    assert r6.many(F).tolist() == [0.8, 0.8]
    assert r9.many(F) == pytest.approx([1.0, 0.4])

    def partial(draft_prob, target_prob, position, draft_entropy, target_entropy,
                top_token_match, block_position, p_max):
        return 1.0
    with pytest.raises(TypeError, match="q_max"):
        S.as_rule(partial)


@pytest.mark.parametrize("name, scalar, vector, kw", RULES, ids=[r[0] for r in RULES])
def test_tokens_per_call_offline_equals_simulation(world, name, scalar, vector, kw):
    """Same block-start contexts; the offline Rao-Blackwellised estimate of each block
    against the mean of real decodes from its context (paired z-test)."""
    pair, ts, sa = world
    off = spec.block_sums(sa, spec.position_terms(sa, spec.rule_thresholds(vector, sa, **kw)))
    ctx, pos = S.block_starts(ts)
    sim = S.block_tokens(pair, ctx, pos, scalar, reps=8, seed=7)
    d = off["tokens"] - sim.mean(axis=1)
    z = d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
    assert abs(z) < Z_MAX, (name, off["tokens"].mean(), sim.mean(), z)


def test_offline_sees_the_difference_simulation_sees(world):
    """The tokens-per-call gain of a lenient rule over the standard one, offline vs
    simulated from the same contexts, agree (and the gain is clearly positive)."""
    pair, ts, sa = world
    ctx, pos = S.block_starts(ts)
    std = spec.objectives(sa, spec.rule_thresholds(rulefns.standard, sa))
    len_ = spec.objectives(sa, spec.rule_thresholds(rulefns.leniency, sa, l=0.5))
    s_std = S.decode_blocks(pair, ctx, pos, HB.standard_rejection, reps=8, seed=8)
    s_len = S.decode_blocks(pair, ctx, pos, HB.leniency, reps=8, seed=8)
    assert len_.tokens_per_call - std.tokens_per_call > 0.1
    gain_sim = s_len.tokens_per_call - s_std.tokens_per_call
    gain_off = len_.tokens_per_call - std.tokens_per_call
    se = np.hypot(s_len.tokens_se, s_std.tokens_se) + 0.5 * (len_.tokens_se + std.tokens_se)
    assert abs(gain_sim - gain_off) < Z_MAX * se


@pytest.mark.parametrize("name, scalar, vector, kw", RULES[:3], ids=[r[0] for r in RULES[:3]])
def test_output_distribution_offline_equals_sampling(world, name, scalar, vector, kw):
    """At held-out contexts, sample the emitted byte and measure out(S) - p(S) for the
    exact witness set S; it must match the offline TV of those positions."""
    pair, ts, sa = world
    rows = S.trace_rows(ts, 60, seed=1)
    terms = spec.position_terms(sa, spec.rule_thresholds(vector, sa, **kw))
    p, q, F = S.rows_features(pair, ts.context[rows], ts.position[rows], ts.block_position[rows])
    a = S.acceptance_matrix(pair, p, q, F, scalar)
    exact = S.exact_output(p, q, a)
    assert np.abs(0.5 * np.abs(exact - p).sum(axis=1) - terms.tv[rows]).max() < 1e-12
    res = S.output_sample(pair, ts.context[rows], ts.position[rows], ts.block_position[rows],
                          scalar, reps=3000, seed=5, witness=exact > p)
    tv = terms.tv[rows].mean()
    assert abs(res.tv_witness - tv) < Z_MAX * res.tv_witness_se + 1e-12, (name, res, tv)
    if name == "standard":
        assert tv < 1e-12
        assert res.tv_plugin == pytest.approx(res.tv_plugin_floor, abs=0.003)
    else:
        assert res.tv_plugin > res.tv_plugin_floor + 0.02


def test_free_running_simulation_is_close_to_offline(world):
    """The rule's own trajectory (not the standard one's block starts) changes tokens
    per call only slightly: agreement within the sampling error of both."""
    pair, ts, sa = world
    for scalar, vector, kw in [(HB.standard_rejection, rulefns.standard, {}),
                               (HB.leniency, rulefns.leniency, {"l": 0.5})]:
        b = spec.block_sums(sa, spec.position_terms(sa, spec.rule_thresholds(vector, sa, **kw)))
        per_seq = b["tokens"].reshape(-1, tracekit.TINY.blocks_per_prompt).mean(axis=1)
        off, off_se = per_seq.mean(), per_seq.std(ddof=1) / np.sqrt(per_seq.size)
        free = S.decode_free(pair, scalar, split="valid", prompts=64, blocks=8, seed=9)
        assert free.n_blocks == 512 and free.n_sequences == 64
        assert abs(free.tokens_per_call - off) < Z_MAX * np.hypot(free.tokens_se, off_se), \
            (scalar.__name__, free, off, off_se)
