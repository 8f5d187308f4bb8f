"""The exact objectives on critical-token labels (evolve.objectives.task_labels)
against a Monte Carlo of the acceptance coins: one uniform per drafted row, the
standard rule keeping it iff u < s and the rule iff u < a (so 'beyond the standard
rule' is s <= u < a), blocks cut at the first rejection."""

from __future__ import annotations

import numpy as np
import pytest

from evolve.objectives import task_labels as TL

G, BLOCKS, REPS = 4, 400, 4000


def _arrays(rng, greedy: bool):
    n = G * BLOCKS
    if greedy:
        s = (rng.random(n) < 0.6).astype(float)          # argmax drafts
        inside, outside = s < 1.0, np.ones(n)
    else:
        s = np.where(rng.random(n) < 0.5, 1.0, rng.random(n))
        inside = rng.random(n) < 0.8                      # the draft's top-k
        outside = s
    crit = np.where(s < 1.0, (rng.random(n) < 0.3).astype(np.int8), TL.UNLABELED)
    return TL.TaskArrays(G, s, inside, outside, crit)


def _monte_carlo(h, ta, rng):
    a = TL.acceptance(h[None, :], ta)[0].reshape(-1, G)
    s, c = ta.s.reshape(-1, G), ta.critical.reshape(-1, G)
    tot = dict(tokens=0.0, reached=0.0, accepted=0.0, crit=0.0, harmless=0.0, fr=0.0)
    for _ in range(REPS // 100):
        u = rng.random((100,) + a.shape)
        keep = u < a
        reached = np.concatenate([np.ones(keep.shape[:2] + (1,), bool),
                                  np.cumprod(keep, axis=2)[:, :, :-1].astype(bool)], axis=2)
        acc = reached & keep
        beyond = reached & (u >= s) & keep
        tot["tokens"] += (acc.sum(axis=2) + 1).sum()
        tot["reached"] += reached.sum()
        tot["accepted"] += acc.sum()
        tot["crit"] += (beyond & (c == 1)).sum()
        tot["harmless"] += (beyond & (c == 0)).sum()
        tot["fr"] += (reached & ~keep & (c == 0) & (s < 1)).sum()
    return {k: v / REPS for k, v in tot.items()}


@pytest.mark.parametrize("greedy", [True, False])
def test_exact_sums_equal_the_monte_carlo_of_the_coins(greedy):
    rng = np.random.default_rng(3 + greedy)
    ta = _arrays(rng, greedy)
    TL.check_labels(ta, "t")
    h = rng.random(ta.s.size) * 1.4 - 0.2            # thresholds below 0 and above 1 too
    got = dict(zip(TL.SUMS, TL.sums(h, ta)[0]))
    mc = _monte_carlo(h, ta, np.random.default_rng(9))
    assert got["blocks"] == BLOCKS
    for key, mkey in (("tokens", "tokens"), ("reached", "reached"), ("accepted", "accepted"),
                      ("critical_accepted", "crit"), ("harmless_extra", "harmless"),
                      ("false_rejects", "fr")):
        sd = max(np.sqrt(max(got[key], 1.0) / REPS) * 3, 1e-9)
        assert abs(got[key] - mc[mkey]) < 5 * sd + 1e-3 * got[key], (key, got[key], mc[mkey])
    m = TL.measures(TL.sums(h, ta))
    assert 1.0 <= m["tokens_per_call"][0] <= G + 1


def test_the_standard_rule_accepts_nothing_critical_and_always_accept_everything():
    rng = np.random.default_rng(1)
    ta = _arrays(rng, True)
    std = TL.measures(TL.sums(np.zeros(ta.s.size), ta))       # greedy: mismatches refused
    assert std["critical_per_token"][0] == 0.0 and std["harmless_extra_per_token"][0] == 0.0
    every = TL.measures(TL.sums(np.ones(ta.s.size), ta))
    assert every["tokens_per_call"][0] == G + 1
    assert every["false_rejects_per_token"][0] == 0.0
    crit = ((ta.critical == 1) & (ta.s < 1)).sum()
    assert every["critical_per_token"][0] == pytest.approx(crit / (BLOCKS * (G + 1)))
    assert TL.seed_fitness(every)[0] < TL.seed_fitness(std)[0]


def test_unlabeled_rows_the_standard_rule_could_reject_are_refused():
    rng = np.random.default_rng(2)
    ta = _arrays(rng, True)
    crit = ta.critical.copy()
    row = int(np.flatnonzero(ta.s < 1)[3])
    crit[row] = TL.UNLABELED
    with pytest.raises(ValueError, match=f"row {row}"):
        TL.check_labels(TL.TaskArrays(G, ta.s, ta.inside, ta.outside, crit), "t")


def _slow(h, ta):
    """The totals and the seed's metric by a loop over blocks and slots, from the
    definitions: a slot is reached when every earlier one was kept; the rule keeps it
    with probability a (its clipped threshold where it decides, else the outside
    acceptance), the standard rule with s; beyond-standard acceptances (a - s)+ are
    false accepts on critical rows, harmless extras on the others; a harmless row the
    standard rule could reject (s < 1) is falsely rejected with probability 1 - a."""
    t = dict(blocks=0.0, tokens=0.0, reached=0.0, accepted=0.0, crit=0.0, harmless=0.0,
             fr=0.0)
    for b in range(ta.n_blocks):
        reach = 1.0
        t["blocks"] += 1
        t["tokens"] += 1                                # the bonus or correction token
        for j in range(b * ta.g, (b + 1) * ta.g):
            a = min(1.0, max(0.0, h[j])) if ta.inside[j] else ta.outside[j]
            t["reached"] += reach
            t["accepted"] += reach * a
            t["tokens"] += reach * a
            beyond = reach * max(0.0, a - ta.s[j])
            t["crit" if ta.critical[j] == 1 else "harmless"] += \
                beyond if ta.critical[j] >= 0 else 0.0
            if ta.critical[j] == 0 and ta.s[j] < 1.0:
                t["fr"] += reach * (1.0 - a)
            reach *= a
    accept, fa, fr = t["accepted"] / t["reached"], t["crit"] / t["reached"], \
        t["fr"] / t["reached"]
    q = max(0.0, 1.0 - (10.0 * fa + 0.1 * fr))
    return t, (accept * q if q >= 0.95 else 0.5 * q)


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sample"])
def test_sums_and_the_seed_metric_equal_a_loop_over_blocks(greedy):
    """``sums``, ``measures`` and ``seed_fitness`` against ``_slow``, for thresholds
    that keep quality above the seed's 0.95 and ones that do not. Planted one at a
    time, each fails it: false accepts weighed 1 instead of 10, false rejects 0.01
    instead of 0.1, the halving below 0.9 instead of 0.95, |a - s| for (a - s)+.
    (Counting false rejects where s = 1 changes nothing: such rows carry no label.)"""
    rng = np.random.default_rng(11 + greedy)
    ta = _arrays(rng, greedy)
    ta = TL.TaskArrays(G, ta.s[:G * 60], ta.inside[:G * 60], ta.outside[:G * 60],
                       ta.critical[:G * 60], answers=7)
    n = ta.s.size
    hs = np.stack([rng.random(n) * 1.4 - 0.2, np.zeros(n), np.full(n, 0.02),
                   np.where(ta.critical == 1, 0.0, 0.9)])
    seeds = TL.seed_fitness(TL.measures(TL.sums(hs, ta)))
    seen_low = seen_high = False
    for h, got_row, seed in zip(hs, TL.sums(hs, ta), seeds):
        want, want_seed = _slow(h, ta)
        got = dict(zip(TL.SUMS, got_row))
        for key, wkey in (("blocks", "blocks"), ("tokens", "tokens"), ("reached", "reached"),
                          ("accepted", "accepted"), ("critical_accepted", "crit"),
                          ("harmless_extra", "harmless"), ("false_rejects", "fr")):
            assert got[key] == pytest.approx(want[wkey], rel=1e-12, abs=1e-12), key
        assert got["answers"] == 7
        assert seed == pytest.approx(want_seed, rel=1e-12, abs=1e-15)
        q = 1.0 - 10.0 * want["crit"] / want["reached"] - 0.1 * want["fr"] / want["reached"]
        seen_low |= q < 0.95
        seen_high |= q >= 0.95
    assert seen_low and seen_high                 # both branches of the seed's metric


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sample"])
def test_sums_are_the_same_bits_for_any_split_of_the_blocks(greedy):
    """Each block's values are added in fixed point, so the sums of parts of a split,
    in any order, are the whole split's sums bit for bit (what shards, a cluster and
    chunks of rows rely on). Planted, each fails it: the blocks' float values added
    in float, the parts' float sums added."""
    from evolve.kernels import fixed
    rng = np.random.default_rng(5 + greedy)
    ta = _arrays(rng, greedy)
    ta = TL.TaskArrays(G, ta.s, ta.inside, ta.outside, ta.critical, answers=37)
    hs = rng.random((5, ta.s.size)) * 1.4 - 0.2
    whole = TL.sums(hs, ta)
    assert whole[:, 0].tolist() == [BLOCKS] * 5 and whole[:, -1].tolist() == [37] * 5
    for cuts in ([BLOCKS // 2], [1, 2, 3, 97, 250, 399], list(range(1, BLOCKS))):
        edges = [0, *cuts, BLOCKS]
        parts = [TL.fixed_sums(hs[:, lo * G:hi * G], ta.blocks(lo, hi))
                 for lo, hi in zip(edges[:-1], edges[1:])]
        rng.shuffle(parts)
        got = TL.from_fixed(fixed.total(parts), BLOCKS, 37)
        np.testing.assert_array_equal(got, whole)
