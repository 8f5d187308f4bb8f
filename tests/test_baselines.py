"""Baselines: the published table, compiled == plain Python, tree forms == functions."""

import numpy as np
import pytest

from evolve.lang import treeio
from evolve.rules.table import RULES

SEED_TREES = {n: r.tree() for n, r in RULES.items() if r.data == "tokens"}
from evolve.kernels.tokens import TokenArrays, population_thresholds
from evolve.runs.scoring import PreparedSplit, score
from heuristics import registry

# The original benchmark's published table (train split): accept %, accuracy %, fitness.
PUBLISHED = {
    "standard_rejection": (78.5, 100.0, 0.785),
    "always_accept": (100.0, 78.5, 0.000),
    "conservative": (33.2, 54.7, 0.317),
    "entropy_aware": (61.6, 83.2, 0.606),
    "ratio_floor_0.3": (78.7, 99.7, 0.766),
}


@pytest.fixture(scope="module")
def train(default_splits):
    return PreparedSplit(default_splits["train"])


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_published_rows_reproduced(name, train):
    m = score(registry.compiled(name), train, repeats=1)
    acc, accuracy, fit = PUBLISHED[name]
    assert abs(100 * m["accept_rate"] - acc) <= 1.5
    assert abs(100 * m["accuracy"] - accuracy) <= 1.5
    assert abs(m["fitness"] - fit) <= 0.015


def test_standard_rejection_is_exact(default_splits):
    for ds in default_splits.values():
        m = score(registry.compiled("standard_rejection"), PreparedSplit(ds), repeats=1)
        assert m["accuracy"] == 1.0 and m["false_accepts"] == 0 and m["false_rejects"] == 0


@pytest.mark.parametrize("name", registry.names())
def test_compiled_equals_plain_python(name, default_splits):
    ds = default_splits["valid"]
    fn = registry.get(name)
    h = registry.compiled(name)(*ds.features())
    cols = [c.tolist() for c in ds.features()]
    for j in range(0, len(ds), 37):
        assert float(fn(*(c[j] for c in cols))) == h[j]


@pytest.mark.parametrize("name", list(SEED_TREES))
def test_tree_forms_decide_like_the_baselines(name, default_splits):
    ds = default_splits["train"]
    h_tree = population_thresholds(treeio.linearise([treeio.parse(SEED_TREES[name])]),
                                   TokenArrays(ds))[0]
    h_fn = registry.compiled(name)(*ds.features())
    assert np.array_equal(ds.rand_value < h_tree, ds.rand_value < h_fn)


def test_literature_anchor_definitions():
    from heuristics import baselines as b
    # typical acceptance: t > min(0.09, 0.3 exp(-H))
    assert b.typical_acceptance(0.5, 0.1, 0, 1.0, 0.0, False) == 1.0
    assert b.typical_acceptance(0.5, 0.05, 0, 1.0, 0.0, False) == 0.0   # 0.05 < min(.09,.3)
    assert b.typical_acceptance(0.5, 0.05, 0, 1.0, 5.0, False) == 1.0   # 0.3 e^-5 = 0.002
    # BiLD: -log t <= 5
    assert b.bild_rollback(0.5, 0.0068, 0, 1, 1, False) == 1.0
    assert b.bild_rollback(0.5, 0.0066, 0, 1, 1, False) == 0.0
    assert b.leniency(0.8, 0.2, 0, 1, 1, False) == 0.5


def test_unknown_heuristic_name():
    with pytest.raises(KeyError):
        registry.get("nope")
