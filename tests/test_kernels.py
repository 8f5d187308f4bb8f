"""The population kernel against the slow references (tests/naive.py)."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.data import tokens as data
from evolve.objectives import metrics as fitness
from evolve.lang import treeio
from evolve.lang.randtrees import random_trees  # noqa: F401 (tests import it from here)
from evolve.lang import primitives as P
from evolve.kernels.tokens import TokenArrays, population_counts, population_thresholds
from evolve.objectives.tokens import threshold_counts
from tests import naive


def assert_same_bits(a, b):
    """The numpy reference's result exactly: its exp and log are heuristics.ops' own
    (compiled as ufuncs), so every primitive gives the kernel's bits."""
    np.testing.assert_array_equal(a, b)


def edge_dataset():
    """Inputs at the edges: 0, 1e-300, 1e300, inf, NaN, negatives (no validation)."""
    vals = np.array([0.0, 1e-300, 1e300, np.inf, -np.inf, np.nan, -1.0, 0.5, 1.0, 1e-9,
                     -1e-9, 50.0, 51.0, -1e300, 2.0, 1e-12])
    n = len(vals)
    rng = np.random.default_rng(0)
    cols = {
        "draft_prob": vals,
        "target_prob": np.roll(vals, 3),
        "position": np.arange(n, dtype=np.int64) * 7,
        "draft_entropy": np.roll(vals, 5),
        "target_entropy": np.roll(vals, 11),
        "top_token_match": rng.random(n) < 0.5,
        "rand_value": rng.random(n),
        "baseline_accepts": rng.random(n) < 0.5,
    }
    return data.Dataset(**cols, name="edge")


def test_kernel_equals_references_on_random_trees(small_splits):
    ds = small_splits["valid"]
    trees = random_trees(150, seed=11)
    progs = treeio.linearise(trees)
    split = TokenArrays(ds)
    th = population_thresholds(progs, split)
    rows = population_counts(progs, split)
    for i, nodes in enumerate(trees):
        # bit for bit against the scalar and the numpy reference, with the same counts
        np.testing.assert_array_equal(th[i], naive.eval_rows(nodes, ds),
                                      err_msg=treeio.to_string(nodes))
        ref_np = naive.eval_numpy(nodes, ds)
        assert_same_bits(th[i], ref_np)
        ref = naive.metrics_naive(ref_np, ds)
        got = fitness.Counts.from_raw(len(ds), rows[i]).metrics()
        assert (rows[i][0], rows[i][1], rows[i][2]) == \
            (ref["accepted"], ref["false_accepts"], ref["false_rejects"])
        for key in ("accept_rate", "accuracy", "quality", "fitness", "expected_accept_rate",
                    "expected_fitness"):
            assert got[key] == ref[key], key


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # numpy on inf/NaN edge inputs
def test_kernel_edge_inputs():
    ds = edge_dataset()
    trees = random_trees(300, seed=5)
    for text in ("pdiv(draft_prob, target_prob)", "plog(draft_prob)", "pexp(target_prob)",
                 "psqrt(draft_entropy)", "square(target_entropy)", "pmin(draft_prob, target_prob)",
                 "pmax(target_prob, draft_prob)", "ite(lt(draft_prob, target_prob), 1.0, -1.0)",
                 "sub(pexp(draft_prob), pexp(draft_prob))", "mul(1e+300, draft_prob)",
                 "pdiv(1.0, 0.0)", "absf(neg(draft_prob))"):
        trees.append(treeio.parse(text))
    progs = treeio.linearise(trees)
    split = TokenArrays(ds)
    th = population_thresholds(progs, split)
    rows = population_counts(progs, split)
    for i, nodes in enumerate(trees):
        ref = naive.eval_numpy(nodes, ds)
        np.testing.assert_array_equal(th[i], naive.eval_rows(nodes, ds),
                                      err_msg=treeio.to_string(nodes))
        assert_same_bits(th[i], ref)
        c = fitness.counts_from_thresholds(ref, ds.rand_value, ds.baseline_accepts,
                                           np.nan_to_num(ds.standard_threshold()))
        assert c.accepted == rows[i][0] and c.false_accepts == rows[i][1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_nan_threshold_rejects_on_every_path():
    ds = edge_dataset()
    nodes = treeio.parse("psqrt(draft_prob)")  # NaN where draft_prob is NaN
    split = TokenArrays(ds)
    h = population_thresholds(treeio.linearise([nodes]), split)[0]
    assert np.isnan(h).any()
    nan_rows = np.isnan(h)
    c = threshold_counts(np.where(nan_rows, np.nan, 1.0), split)
    assert c.accepted == len(ds) - nan_rows.sum()
    ref = fitness.counts_from_thresholds(np.where(nan_rows, np.nan, 1.0), ds.rand_value,
                                         ds.baseline_accepts, np.zeros(len(ds)))
    assert ref.accepted == c.accepted


def test_deep_and_large_trees(small_splits):
    ds = small_splits["test"]
    deep = "draft_prob"
    for i in range(90):
        deep = f"add({deep}, {float(i)})" if i % 2 else f"mul({deep}, 0.999)"
    wide = random_trees(5, seed=3, min_h=8, max_h=9)
    trees = [treeio.parse(deep)] + wide
    progs = treeio.linearise(trees)
    th = population_thresholds(progs, TokenArrays(ds))
    for i, nodes in enumerate(trees):
        np.testing.assert_array_equal(th[i], naive.eval_rows(nodes, ds))
        assert_same_bits(th[i], naive.eval_numpy(nodes, ds))


def test_counts_independent_of_thread_count(default_splits):
    import numba
    trees = random_trees(64, seed=9)
    progs = treeio.linearise(trees)
    split = TokenArrays(default_splits["valid"])
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = population_counts(progs, split)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = population_counts(progs, split)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, many)


def test_program_reading_missing_input_is_refused(small_splits):
    split = TokenArrays(small_splits["test"])
    split.X = split.X[:2]
    with pytest.raises(ValueError, match="does not have"):
        population_counts(treeio.linearise([treeio.parse("draft_entropy")]), split)


def test_matrix_thresholds_name_a_missing_trace_input():
    """Thresholds over a bare input matrix (a trace split's candidate rows) check the
    inputs the same way and name the missing one, slot features included."""
    from evolve.kernels.tokens import matrix_thresholds
    X = np.linspace(0.1, 0.9, 9 * 4).reshape(9, 4)
    h = matrix_thresholds(treeio.linearise([treeio.parse("mul(p_max, 2.0)")]), X)
    np.testing.assert_array_equal(h[0], X[7] * 2.0)
    with pytest.raises(ValueError, match="reads input 'slot_tv'"):
        matrix_thresholds(treeio.linearise([treeio.parse("add(slot_tv, 1.0)")]), X)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.sampled_from([0.0, 1.0, 0.5, -0.0])), min_size=1, max_size=200),
       st.integers(0, 2 ** 32 - 1))
def test_metrics_match_naive_count(hs, seed):
    rng = np.random.default_rng(seed)
    n = len(hs)
    d = rng.uniform(0.05, 1.0, n)
    t = rng.uniform(0.01, 1.0, n)
    r = rng.random(n)
    ds = data.Dataset(d, t, np.zeros(n, dtype=np.int64), np.ones(n), np.ones(n),
                      rng.random(n) < 0.5, r, r < np.minimum(1, t / d))
    h = np.array(hs, dtype=np.float64)
    ref = naive.metrics_naive(h, ds)
    fast = threshold_counts(h, TokenArrays(ds)).metrics()
    numpy_path = fitness.counts_from_thresholds(h, r, ds.baseline_accepts,
                                                ds.standard_threshold()).metrics()
    for key in ("accept_rate", "accuracy", "quality", "fitness", "expected_accept_rate",
                "expected_fitness"):
        assert fast[key] == ref[key] == numpy_path[key], key
    assert fast["false_accepts"] == ref["false_accepts"]
    assert fast["false_rejects"] == ref["false_rejects"]


def test_reference_metric_formulas():
    # 10 tokens: 2 false accepts, 1 false reject -> quality 1 - (10*0.2 + 0.1*0.1) < 0
    n, acc, fa, fr = 10, 6, 2, 1
    assert fitness.quality(n, fa, fr) == 0.0
    assert fitness.fitness(n, acc, fa, fr) == 0.0
    # quality exactly at the gate uses the acceptance branch
    q = fitness.quality(1000, 0, 500)
    assert q == pytest.approx(0.95)
    assert fitness.fitness(1000, 400, 0, 500) == pytest.approx(0.4 * q) or q < 0.95
    assert fitness.fitness(100, 50, 1, 0) == pytest.approx(0.5 * 0.9)
