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
