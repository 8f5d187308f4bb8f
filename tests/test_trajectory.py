"""Trajectory-aware offline estimates (evolve.objectives.trajectory) against the plain
offline objectives and against free-running decoding from the traces' own prompts and
uniforms (the n-gram pair of tests/tracekit.py)."""

from dataclasses import replace

import numpy as np
import pytest

from evolve.data import decode as DEC
from evolve.data import traces as T
from evolve.data.sources import ngram as NG
from evolve.objectives import spec
from evolve.objectives import trajectory as TR
from evolve.rules.adapters import named_rule
from evolve.freerun.simulate import offline_thresholds
from tests import tracekit

CFG = replace(tracekit.TINY, test_prompts=2048, blocks_per_prompt=8)


@pytest.fixture(scope="module")
def data():
    pair = NG.build_pair(CFG)
    pr, rngs = NG.prompt_starts(pair, "test")
    cols, _ = DEC.decode(pair, pr, rngs, CFG.blocks_per_prompt)
    ts = T.TraceSplit(cols, {"block_size": CFG.block_size, "top_k": CFG.top_k,
                             "config": CFG.to_dict()}, name="test")
    return pair, ts, spec.TraceArrays.from_split(ts), TR.TraceBlocks.from_split(ts)


def _h(rule, sa):
    return offline_thresholds(rule, sa)


def _free(pair, rule):
    """Free-running tokens per call of every sequence, from the traces' prompts and
    uniforms (the first block decodes the recorded block's draws)."""
    pr, rngs = NG.prompt_starts(pair, "test")
    _, acc = DEC.decode(pair, pr, rngs, CFG.blocks_per_prompt, rule=rule, record=False)
    return (acc + 1.0).mean(axis=1)


def test_standard_rule_has_unit_weights_and_the_plain_estimate(data):
    _, _, sa, tb = data
    h = _h(named_rule("standard_rejection")[0], sa)
    terms = spec.position_terms(sa, h)
    assert np.array_equal(TR.block_weights(sa, tb, terms.a_x), np.ones(sa.n_blocks))
    est = TR.estimate(sa, tb, h)
    off = spec.objectives(sa, h)
    assert est.tokens_per_call == pytest.approx(off.tokens_per_call, rel=1e-12)
    assert est.effective_sequences == pytest.approx(CFG.test_prompts)


def test_a_block_weight_by_hand(data):
    """The weight of a second block is the likelihood ratio of the recorded first block:
    accepted drafts a_R / a_S, the rejected one (1 - a_R) / (1 - a_S)."""
    _, ts, sa, tb = data
    rule = named_rule("leniency", 0.6)[0]
    terms = spec.position_terms(sa, _h(rule, sa))
    w = TR.block_weights(sa, tb, terms.a_x)
    g = sa.g
    acc = ts.columns["baseline_accepts"].reshape(-1, g)
    checked = 0
    for blk in range(0, 40):
        if tb.block[blk + 1] != 1:
            continue
        lr = 1.0
        for j in range(g):
            aR, aS = terms.a_x[blk * g + j], sa.std_x[blk * g + j]
            if acc[blk, j]:
                lr *= aR / aS
            else:
                lr *= (1 - aR) / (1 - aS)
                break
        assert w[blk + 1] == pytest.approx(lr, rel=1e-12)
        assert w[blk] == 1.0
        checked += 1
    assert checked >= 5


def test_weights_average_one_at_every_block_index(data):
    """E_standard[w_b] = 1: the reweighted trajectories are a probability distribution."""
    _, _, sa, tb = data
    w = TR.block_weights(sa, tb, spec.position_terms(
        sa, _h(named_rule("leniency", 0.6)[0], sa)).a_x)
    for b in range(1, CFG.blocks_per_prompt):
        wb = w[tb.block == b]
        assert abs(wb.mean() - 1.0) < 4 * wb.std(ddof=1) / np.sqrt(wb.size), b
        assert wb.std() > 0.05                       # the rule does reweight


def test_trajectory_aware_estimate_matches_free_running_where_the_plain_one_does_not(data):
    pair, _, sa, tb = data
    rule = named_rule("leniency", 0.4)[0]
    h = _h(rule, sa)
    free = _free(pair, rule)
    plain = TR.sequence_tokens(sa, tb, h, trajectory=False)[0]
    traj = TR.sequence_tokens(sa, tb, h)[0]

    def z(d):
        return d.mean() / (d.std(ddof=1) / np.sqrt(d.size))
    assert abs(z(plain - free)) > 4, z(plain - free)       # the gap this estimator closes
    assert abs(z(traj - free)) < 3, (z(traj - free), z(plain - free))
    est = TR.estimate(sa, tb, h)
    assert est.tokens_per_call == pytest.approx(traj.mean(), rel=1e-12)
    assert 0 < est.effective_sequences < CFG.test_prompts
    d, se = TR.paired_difference(sa, tb, h, _h(named_rule("standard_rejection")[0], sa))
    std_free = _free(pair, named_rule("standard_rejection")[0])
    assert abs(d - (free - std_free).mean()) < 3 * np.hypot(se, (free - std_free).std(
        ddof=1) / np.sqrt(free.size))
