"""The learned value gate (evolve.rules.value_gate) and its trade-off rows."""

import dataclasses

import numpy as np
import pytest

from evolve.data import emission
from evolve.data.decode import lookahead_features, slot_features
from evolve.lang import numpy_eval, treeio
from evolve.lang import primitives as P
from evolve.objectives import spec
from evolve.rules import headroom, tuning, value_gate as VG
from evolve.rules.adapters import TreeRule
from tests import tracekit


@pytest.fixture(scope="module")
def sas():
    return {s: spec.TraceArrays.from_split(tracekit.split(s)) for s in ("valid", "test")}


def _rows(sa, names):
    F = sa.features()
    return np.stack([F[f].reshape(sa.n, sa.k)[:, 0] for f in names], axis=1)


def test_the_first_tree_splits_where_a_brute_force_search_over_the_same_cuts_does(sas):
    """Depth 1, one round: the split with the least squared error over every input and
    every candidate cut that leaves MIN_LEAF rows a side, found by brute force."""
    sa = sas["valid"]
    y = headroom.continuation(sa)
    X = _rows(sa, VG.ROW_INPUTS)
    best = None
    qs = np.linspace(0.0, 1.0, VG.BINS + 1)[1:-1]
    for j in range(X.shape[1]):
        for c in np.unique(np.quantile(X[:, j], qs)):
            left = X[:, j] < c
            if min(left.sum(), (~left).sum()) < VG.MIN_LEAF:
                continue
            sse = ((y[left] - y[left].mean()) ** 2).sum() + ((y[~left] - y[~left].mean())
                                                              ** 2).sum()
            if best is None or sse < best[0] - 1e-9:
                best = (sse, VG.ROW_INPUTS[j], c, y[left].mean(), y[~left].mean())
    ys = np.asarray(y)
    got = VG._grow(*VG.binned(X), ys - ys.mean(), np.arange(len(ys)), 1)
    j, c, lo, hi = got
    assert (VG.ROW_INPUTS[j], c) == best[1:3]
    assert lo + ys.mean() == pytest.approx(best[3]) and hi + ys.mean() == pytest.approx(best[4])


@pytest.mark.parametrize("lookahead", [False, True])
def test_the_value_model_is_a_tree_that_predicts_the_continuation(sas, lookahead):
    value = VG.fit(sas["valid"], lookahead)
    nodes = treeio.parse(value)
    assert P.uses_lookahead_inputs(nodes) == lookahead
    assert VG.fit(sas["valid"], lookahead) == value                  # deterministic
    for s, sa in sas.items():
        y = headroom.continuation(sa)
        pred = VG.predictions(value, sa)
        r2 = 1 - ((pred - y) ** 2).mean() / y.var()
        assert r2 > (0.5 if lookahead else 0.3), (s, r2)
        F = sa.features()      # one value per slot: every candidate of a slot the same
        v = numpy_eval.evaluate(nodes, F).reshape(sa.n, sa.k)
        assert np.array_equal(v, np.repeat(v[:, :1], sa.k, axis=1))


@pytest.mark.parametrize("cap", [None, 0.05])
def test_the_gate_is_standard_below_lambda_and_spends_above(sas, cap):
    sa = sas["test"]
    value = VG.fit(sas["valid"])
    pred = VG.predictions(value, sa)
    lam = float(np.median(pred))
    F = sa.features()
    h = numpy_eval.evaluate(treeio.parse(VG.gate_tree(value, lam, cap)), F).reshape(sa.n, sa.k)
    std = np.minimum(1.0, F["target_prob"] / F["draft_prob"]).reshape(sa.n, sa.k)
    stv = F["slot_tv"].reshape(sa.n, sa.k)
    w = 1.0 if cap is None else np.where(stv > 1e-12, np.minimum(1.0, cap / np.where(
        stv > 0, stv, 1.0)), 1.0)
    want = np.where((pred >= lam)[:, None], std + w * (1.0 - std), std)
    assert np.allclose(h, want, rtol=0, atol=1e-15)
    assert (pred >= lam).any() and (pred < lam).any()


def test_the_capped_spend_adds_exactly_the_smaller_of_the_slot_tv_and_the_cap():
    """Over the full vocabulary the emitted distribution moves linearly from p to q, so a
    gated slot's TV is w TV(p, q) = min(TV(p, q), cap), and an ungated slot's is 0."""
    rng = np.random.default_rng(0)
    M, V, g, cap = 64, 12, 4, 0.08
    p = rng.dirichlet(np.ones(V) * 0.7, M)
    q = rng.dirichlet(np.ones(V) * 0.7, M)
    tv = slot_features(p, q)["slot_tv"]
    look = lookahead_features(tv, g)
    bpos = np.tile(np.arange(g), M // g)
    # a value that is the lookahead input itself: the gate opens where ahead >= λ
    lam = float(np.median(look["ahead"]))
    rule = TreeRule(treeio.parse(VG.gate_tree("ahead", lam, cap)), "gate")
    got, _ = emission.slot_distortion(p, q, np.arange(M), bpos, rule, V, look)
    gated = look["ahead"] >= lam
    assert gated.any() and (~gated).any() and (tv[gated] > cap).any()
    assert np.allclose(got[gated], np.minimum(tv[gated], cap), atol=1e-12)
    assert np.allclose(got[~gated], 0.0, atol=1e-12)


@pytest.mark.parametrize("budget", [0.01, 0.03])
def test_tuning_finds_the_best_lambda_of_a_brute_force_sweep(sas, budget):
    sa = sas["valid"]
    value = VG.fit(sa)
    lam, o = VG.tune(value, sa, budget, cap=0.2)
    assert o.tv_per_token <= budget
    v = np.unique(VG.predictions(value, sa))
    lams = np.concatenate([[v[0] - 1.0], 0.5 * (v[:-1] + v[1:]), [v[-1] + 1.0]])
    step = max(1, len(lams) // 60)          # a sweep every few values, and both ends
    best = 0.0
    for x in list(lams[::step]) + [lams[-1]]:
        t = spec.objectives(sa, tuning.tree_thresholds(treeio.parse(
            VG.gate_tree(value, x, 0.2)), sa))
        if t.tv_per_token <= budget:
            best = max(best, t.tokens_per_call)
    assert o.tokens_per_call >= best - 1e-12
    exact = spec.objectives(sa, tuning.tree_thresholds(treeio.parse(
        VG.gate_tree(value, lam, 0.2)), sa))
    assert exact.tokens_per_call == pytest.approx(o.tokens_per_call, rel=1e-12)


def test_the_gate_needs_slot_features():
    sa = dataclasses.replace(spec.TraceArrays.from_split(tracekit.split("valid")),
                             missing="no slot features here")
    with pytest.raises(ValueError, match="slot features"):
        VG.fit(sa)


def test_the_tradeoff_reports_both_gates_fit_and_tuned_on_valid(sas):
    rep = tuning.tradeoff(sas["valid"], sas["test"], [0.03])
    rows = {r["rule"]: r for r in rep["budgets"][0]["rows"]}
    pos = rows["position_leniency"]
    cap = tuning.position_p99(pos, sas["valid"])
    for name, look in tuning.GATES.items():
        r = rows[name]
        assert r["kind"] == "learned" and r["estimate"] is look and r["tv_cap"] == cap
        assert r["fits_valid"] and r["valid"]["tv_per_token"] <= 0.03
        value = VG.fit(sas["valid"], look)
        assert r["tree"] == VG.gate_tree(value, r["param"], cap)
        test = spec.objectives(sas["test"], tuning.tree_thresholds(treeio.parse(r["tree"]),
                                                                   sas["test"]))
        assert r["test"]["tokens_per_call"] == test.tokens_per_call
    # without per-position leniency (an engine's knobs only): no gates either
    rep = tuning.tradeoff(sas["valid"], sas["test"], [0.03], headroom=False,
                          names=["standard_rejection", "leniency"])
    assert not {r["rule"] for r in rep["budgets"][0]["rows"]} & set(tuning.GATES)


@pytest.mark.parametrize("k", [1, 5, 12])
def test_acceptance_judged_on_the_top_k_equals_judged_on_the_whole_vocabulary(sas, k):
    """``emission.acceptance`` evaluates a top-k rule on the draft's top-k tokens only;
    the thresholds are those of evaluating it on every token and keeping the top-k
    (the reference below), bit for bit, for trees that give NaN too."""
    from evolve.data.decode import clipped, judges_every_draft, top_candidates
    from evolve.rules.adapters import named_rule
    rng = np.random.default_rng(1)
    M, V, g = 40, 12, 4
    p = rng.dirichlet(np.ones(V) * 0.5, M)
    q = rng.dirichlet(np.ones(V) * 0.5, M)
    look = lookahead_features(slot_features(p, q)["slot_tv"], g)
    F = emission.vocab_features(p, q, np.arange(M), np.arange(M) % g, look)
    value = VG.fit(sas["valid"], True)
    rules = [TreeRule(treeio.parse(VG.gate_tree(value, 2.0, 0.1)), "gate"),
             TreeRule(treeio.parse("plog(sub(target_prob, mul(0.5, draft_prob)))"), "nan"),
             named_rule("hf_ensemble", 0.7)[0]]
    assert [judges_every_draft(r) for r in rules] == [False, False, True]
    for rule in rules:
        h = rule.many({f: v.reshape(-1) for f, v in F.items()})
        a = clipped(h).reshape(M, V)
        if not judges_every_draft(rule):
            in_top = np.zeros((M, V), dtype=bool)
            np.put_along_axis(in_top, top_candidates(q, k), True, axis=1)
            a = np.where(in_top, a, np.minimum(1.0, p / q))
        got = emission.acceptance(p, q, F, rule, k)
        assert np.array_equal(got, a), rule.name


tiny_dir = tracekit.tiny_dir_fixture()


def test_evolve_tradeoff_prints_the_gates_and_marks_the_estimate(tiny_dir):
    """The command's table: each gate with its tuned λ, the one that reads ``ahead``
    marked an estimate; the Python API's best rule is never an estimate."""
    import evolve
    from tests.clikit import invoke
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, env={"COLUMNS": "240"})
    assert r.exit_code == 0, r.output
    lines = {}          # each gate's row of the budget's table (the first of its rows)
    for ln in r.stdout.splitlines():
        if ln.startswith("value_gate"):
            lines.setdefault(ln.split()[0], ln)
    assert set(lines) == set(tuning.GATES)
    assert "λ=" in lines["value_gate"] and "estimate" not in lines["value_gate"]
    assert "estimate: reads a lookahead input" in lines["value_gate_ahead"]
    oracle = next(ln for ln in r.stdout.splitlines() if ln.startswith("knapsack_oracle"))
    assert "a bound, not a rule" in oracle and "over budget" not in oracle
    t = evolve.tradeoff(tiny_dir, budgets=[0.03], installed=False)
    rows = {r_["rule"]: r_ for r_ in t.rows}
    assert rows["value_gate_ahead"]["estimate"] and not rows["value_gate"]["estimate"]
    best = t.best(0.03)
    assert not best["estimate"]
    assert best["test_tokens_per_call"] == max(
        r_["test_tokens_per_call"] for r_ in t.rows if r_["fits_valid"] and not r_["estimate"]
        and r_["kind"] != "oracle" and r_["test_tokens_per_call"] is not None)


def test_a_split_too_small_to_split_gives_a_constant_model_and_a_gate_that_still_tunes(sas):
    """Fewer than 2 x MIN_LEAF rows: every tree is a leaf, the model a constant that reads
    no input; the gate then accepts all slots or none, and tuning still answers."""
    small = sas["valid"].blocks(list(range(VG.MIN_LEAF // sas["valid"].g)))
    assert small.n < 2 * VG.MIN_LEAF
    value = VG.fit(small)
    assert not any(n.kind == "input" for n in treeio.parse(value))
    pred = VG.predictions(value, small)
    assert pred.shape == (small.n,) and np.all(pred == pred[0])
    lam, o = VG.tune(value, small, 0.03)
    assert o.tv_per_token <= 0.03
