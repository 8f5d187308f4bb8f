"""Headroom: per-position leniency and the knapsack oracle (evolve.rules.headroom)."""

import numpy as np
import pytest

from evolve.lang import numpy_eval, treeio
from evolve.objectives import spec
from evolve.rules import headroom, tuning
from tests import tracekit

BUDGETS = (0.01, 0.03)


@pytest.fixture(scope="module")
def sa():
    return spec.TraceArrays.from_split(tracekit.split("valid"))


def test_position_leniency_tree_is_leniency_by_block_position(sa):
    ls = (0.6, 0.8, 0.9, 1.0)
    F = sa.features()
    h = numpy_eval.evaluate(treeio.parse(headroom.position_leniency_tree(ls)), F)
    L = np.asarray(ls)[F["block_position"].astype(int)]
    assert np.array_equal(h, np.minimum(1.0, F["target_prob"] / (L * F["draft_prob"])))


@pytest.mark.parametrize("budget", BUDGETS)
def test_tuned_position_leniency_fits_and_is_not_worse_than_its_uniform_start(sa, budget):
    ls, o = headroom.tune_position_leniency(sa, budget)
    assert o.tv_per_token <= budget and len(ls) == sa.g
    # the search includes every uniform l of its grid: it is at least as good as the best
    best_uniform = max((tuning.evaluate("leniency", sa, v) for v in headroom.GRID),
                       key=lambda p: p.tokens if p.tv <= budget else -1)
    assert o.tokens_per_call >= best_uniform.tokens - 1e-12


@pytest.mark.parametrize("budget", BUDGETS)
def test_oracle_spends_the_budget_and_beats_rules_tuned_on_the_same_split(sa, budget):
    o = headroom.knapsack_oracle(sa, budget)
    assert o.tv_per_token == pytest.approx(budget, rel=1e-6)
    for family in ("leniency", "ears"):
        t = tuning.tune(family, sa, budget)
        assert o.tokens_per_call > t.tokens
    assert o.tokens_per_call > headroom.tune_position_leniency(sa, budget)[1].tokens_per_call


def test_continuation_values_from_first_principles(sa):
    """1 + V_{i+1}: the last position of a block has nothing after it; earlier ones add
    the expected acceptance of the next slot times the draft's own survival."""
    c = headroom.continuation(sa).reshape(sa.n_blocks, sa.g)
    assert np.all(c[:, -1] == 1.0)
    std = spec.position_terms(sa, np.minimum(1.0, sa.cp / sa.cq))
    al = std.alpha.reshape(sa.n_blocks, sa.g)
    ax = std.a_x.reshape(sa.n_blocks, sa.g)
    j = sa.g - 2
    assert np.allclose(c[:, j], 1.0 + al[:, j + 1])
    if sa.g >= 3:
        assert np.allclose(c[:, j - 1], 1.0 + al[:, j] + ax[:, j] * al[:, j + 1])
