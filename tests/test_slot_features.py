"""Schema v3: the slot features (evolve.data.decode.slot_features), recorded by the
n-gram decoder, stored, validated; v2 files still load. The slot features as rule
inputs, and the two slot-spending baselines (cactus, fuzzy_sd) against enumeration.

Also guarantee 29 of docs/reliability.md, Trace schema v3: slot features, checked like
the rest: see tests/test_untrusted_files.py.
"""

import math
import zipfile

import numpy as np
import pytest

from evolve.data import decode as DEC
from evolve.data import traces as T
from evolve.data.tokens import DataError
from evolve.lang import codegen, treeio
from evolve.lang import primitives as P
from evolve.objectives import spec
from evolve.rules import tuning
from evolve.rules.table import RULES
from tests import tracekit


def _brute(p, q):
    """One slot at a time, one token at a time, in Python floats."""
    tv = sum(max(0.0, b - a) for a, b in zip(p, q))
    kl_pq = sum(a * (math.log(a) - math.log(max(b, 1e-300))) for a, b in zip(p, q) if a > 0)
    kl_qp = sum(b * (math.log(b) - math.log(max(a, 1e-300))) for a, b in zip(p, q) if b > 0)
    return tv, kl_pq, kl_qp, sum(1 for a, b in zip(p, q) if b > a)


def _random_pq(rng, B, V):
    P = rng.dirichlet(np.full(V, 0.3), size=B)
    Q = rng.dirichlet(np.full(V, 0.3), size=B)
    P[0, :3] = 0.0                      # zeros on either side, and equal rows
    P[0] /= P[0].sum()
    Q[1, -2:] = 0.0
    Q[1] /= Q[1].sum()
    Q[2] = P[2]
    return P, Q


def test_slot_features_match_a_per_slot_loop():
    P, Q = _random_pq(np.random.default_rng(0), 12, 9)
    f = DEC.slot_features(P, Q)
    assert set(f) == set(T.V3_FIELDS)
    for i in range(P.shape[0]):
        tv, kpq, kqp, n = _brute(P[i].tolist(), Q[i].tolist())
        assert f["slot_tv"][i] == pytest.approx(tv, abs=1e-14)
        assert f["slot_kl_pq"][i] == pytest.approx(kpq, rel=1e-12, abs=1e-14)
        assert f["slot_kl_qp"][i] == pytest.approx(kqp, rel=1e-12, abs=1e-14)
        assert f["slot_n_q_gt_p"][i] == n
    assert f["slot_tv"][2] == 0.0 and f["slot_n_q_gt_p"][2] == 0
    assert f["slot_kl_pq"][1] > 100          # p > 0 = q: the floored log, finite
    for name, (_, dtype) in T.V3_FIELDS.items():
        assert f[name].dtype == dtype, name


def test_ngram_traces_record_the_slot_features_of_the_full_models():
    pair = tracekit.pair()
    ts = tracekit.split("valid")
    assert ts.has_slot_features and ts.has_ranks and ts.fields == T.V4_ALL_FIELDS
    rows = np.arange(0, len(ts), 11)
    P = pair.target.probs(ts.context[rows])
    Q = pair.draft.probs(ts.context[rows])
    for j, i in enumerate(rows[:40]):
        # the target's ranks (schema v4): the tokens it finds strictly more probable
        p = P[j].tolist()
        assert ts.target_rank[i] == sum(v > p[ts.token[i]] for v in p)
        assert ts.cand_target_rank[i].tolist() == [sum(v > p[t] for v in p)
                                                   for t in ts.cand_token[i].tolist()]
        tv, kpq, kqp, n = _brute(P[j].tolist(), Q[j].tolist())
        assert ts.slot_tv[i] == pytest.approx(tv, abs=1e-13)
        assert ts.slot_kl_pq[i] == pytest.approx(kpq, rel=1e-11, abs=1e-13)
        assert ts.slot_kl_qp[i] == pytest.approx(kqp, rel=1e-11, abs=1e-13)
        assert ts.slot_n_q_gt_p[i] == n
    # the standard rule's rejection probability at a slot is its TV
    assert np.allclose(ts.slot_tv[rows], 1.0 - np.minimum(P, Q).sum(axis=1), atol=1e-13)


def test_v4_round_trip_and_v3_and_v2_files_still_load(tmp_path):
    ts = tracekit.split("test")
    T.save(ts, tmp_path / "v4.npz")
    with zipfile.ZipFile(tmp_path / "v4.npz") as zf:
        assert {"v3/" + f for f in T.V3_FIELDS} | {"v4/" + f for f in T.V4_FIELDS} \
            <= set(zf.namelist())
    back = T.load(tmp_path / "v4.npz")
    assert back.meta["format_version"] == 4 and back.has_slot_features and back.has_ranks
    for f in T.V4_ALL_FIELDS:
        assert np.array_equal(back.columns[f], ts.columns[f]), f
    v3 = T.TraceSplit({f: ts.columns[f] for f in T.V3_ALL_FIELDS}, dict(ts.meta), "v3")
    T.save(v3, tmp_path / "v3.npz")
    old = T.load(tmp_path / "v3.npz")
    assert old.meta["format_version"] == 3 and old.has_slot_features and not old.has_ranks
    v2 = T.TraceSplit({f: ts.columns[f] for f in T.ALL_FIELDS},
                      {k: v for k, v in ts.meta.items() if k != "vocab_classes"}, "v2")
    T.save(v2, tmp_path / "v2.npz")
    assert T.is_trace_file(tmp_path / "v2.npz")
    old = T.load(tmp_path / "v2.npz")
    assert old.meta["format_version"] == 2 and not old.has_slot_features
    assert old.fields == T.ALL_FIELDS


_save_with = tracekit.saved_with


def _at(i, v):
    def f(a):
        a[i] = v
        return a
    return f


@pytest.mark.parametrize("field, fn, pattern", [
    ("slot_tv", _at(4, 1.5), r"field 'slot_tv' row 4: outside \[0, 1\] \(value 1.5"),
    ("slot_tv", _at(6, -0.25), r"field 'slot_tv' row 6: outside \[0, 1\]"),
    ("slot_kl_pq", _at(3, float("inf")), r"field 'slot_kl_pq' row 3: not finite"),
    ("slot_kl_qp", _at(8, -0.5), r"field 'slot_kl_qp' row 8: a KL divergence must be >= 0"),
    ("slot_n_q_gt_p", _at(2, 257), r"field 'slot_n_q_gt_p' row 2: outside 0..256"),
    ("slot_n_q_gt_p", _at(1, -1), r"field 'slot_n_q_gt_p' row 1: outside 0..256"),
    ("slot_n_q_gt_p", lambda a: a.astype(np.float64), r"field 'slot_n_q_gt_p' must be int64"),
    ("slot_tv", lambda a: a[:-1], r"field 'slot_tv' has shape"),
])
def test_v3_validation_names_file_field_and_row(tmp_path, field, fn, pattern):
    path = _save_with(tmp_path, field, fn)
    with pytest.raises(DataError, match=r"bad\.npz: " + pattern):
        T.load(path)


def test_partial_v3_columns_are_refused_and_missing_members_named(tmp_path):
    ts = tracekit.split("test")
    cols = {f: v for f, v in ts.columns.items() if f != "slot_kl_qp"}
    with pytest.raises(DataError, match="field 'slot_kl_qp' is missing"):
        T.save(T.TraceSplit(cols, dict(ts.meta), "part"), tmp_path / "part.npz")
    assert not (tmp_path / "part.npz").exists()
    T.save(ts, tmp_path / "full.npz")
    with zipfile.ZipFile(tmp_path / "full.npz") as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    with zipfile.ZipFile(tmp_path / "drop.npz", "w") as zf:
        for n, b in members.items():
            if n != "v3/slot_n_q_gt_p":
                zf.writestr(n, b)
    with pytest.raises(DataError, match="drop.npz: .*slot_n_q_gt_p"):
        T.load(tmp_path / "drop.npz")


# --------------------------------------------- the slot features as rule inputs

def _trace(P_, Q_, g=1, seed=0):
    """A schema-v3 split of g-position blocks at the slots P_, Q_ (rows), every token a
    candidate (top-k = vocabulary), through the decoder's own record builder."""
    n, V = P_.shape
    rng = np.random.default_rng(seed)
    X = np.array([rng.choice(V, p=q) for q in Q_]).reshape(-1, g)
    r = np.arange(n)
    qx, px = Q_[r, X.reshape(-1)].reshape(-1, g), P_[r, X.reshape(-1)].reshape(-1, g)
    rand = rng.random(X.shape)
    cs = DEC.candidate_summary(P_, Q_, V, token_dtype=np.int64)
    B = n // g
    cols = DEC.block_records(P_, Q_, X, qx, px, rand, rand < np.minimum(1.0, px / qx), cs,
                             np.zeros(B, np.int64), np.arange(B), 0)
    cols["context"] = np.zeros((n, 0), dtype=np.int32)
    for f in DEC.INT_COLUMNS:
        cols[f] = np.asarray(cols[f], dtype=np.int64)
    ts = T.TraceSplit(cols, {"block_size": g, "top_k": V, "context_len": 0,
                             "vocab_size": V, "format_version": 3}, "slots")
    T.validate(ts, "<slots>")
    return ts


def _emitted(p, q, a):
    """The emitted token's distribution at one slot, by enumeration: draft y and keep
    it with a(y), else draw from norm(max(0, p - q))."""
    V = len(p)
    res = [max(0.0, p[y] - q[y]) for y in range(V)]
    z = sum(res)
    keep = sum(q[x] * a[x] for x in range(V))
    return [q[y] * a[y] + (1.0 - keep) * res[y] / z for y in range(V)]


def _cactus(p, q, delta):
    tv = sum(max(0.0, q[x] - p[x]) for x in range(len(p)))
    m = min(1.0, delta / tv)
    return [1.0 if q[x] <= p[x] else p[x] / q[x] + (1.0 - p[x] / q[x]) * m
            for x in range(len(p))]


def _fuzzy(p, q, T_):
    kl = sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)
    return [1.0 if kl < T_ else min(1.0, a / b) for a, b in zip(p, q)]


def _slots(seed=5, n=6, V=7):
    rng = np.random.default_rng(seed)
    P_ = rng.dirichlet(np.full(V, 0.7), size=n)
    Q_ = rng.dirichlet(np.full(V, 0.7), size=n)
    Q_[1] = 0.97 * P_[1] + 0.03 / V              # a near-equal slot: small TV and KL
    return P_, Q_


@pytest.mark.parametrize("name, value, brute", [
    ("cactus", 0.02, _cactus), ("cactus", 0.15, _cactus), ("cactus", 1.0, _cactus),
    ("fuzzy_sd", 0.01, _fuzzy), ("fuzzy_sd", 0.3, _fuzzy)])
def test_baseline_matches_enumeration_at_each_slot(name, value, brute):
    P_, Q_ = _slots()
    ts = _trace(P_, Q_)
    sa = spec.TraceArrays.from_split(ts)
    assert not sa.missing and tuning.scorable(name, sa) is None
    terms = spec.position_terms(sa, tuning.thresholds(name, sa, value))
    order = ts.cand_token.astype(np.int64)
    for i in range(P_.shape[0]):
        p, q = P_[i].tolist(), Q_[i].tolist()
        a = brute(p, q, value)
        assert all(ax >= min(1.0, pa / qa) - 1e-15 for ax, pa, qa in zip(a, p, q))  # lenient
        out = _emitted(p, q, a)
        assert np.allclose(terms.out[i], np.array(out)[order[i]], atol=1e-13)
        assert terms.alpha[i] == pytest.approx(sum(qx * ax for qx, ax in zip(q, a)), abs=1e-13)
        tv_out = 0.5 * sum(abs(o - pp) for o, pp in zip(out, p))
        assert terms.tv[i] == pytest.approx(tv_out, abs=1e-13)
        extra = sum(qx * (ax - min(1.0, pa / qx)) for qx, ax, pa in zip(q, a, p))
        assert terms.extra[i] == pytest.approx(extra, abs=1e-13)
        assert tv_out == pytest.approx(extra, abs=1e-13)   # lenient: TV = extra mass
        if name == "cactus":                               # the constant spend
            assert extra == pytest.approx(min(value, ts.slot_tv[i]), abs=1e-13)
    got = tuning.evaluate(name, sa, value).objectives
    kern = tuning.scored(name, sa, [value])[0].objectives       # the kernel, same numbers
    assert kern.tokens_per_call == pytest.approx(got.tokens_per_call, rel=1e-12)
    assert kern.tv_per_token == pytest.approx(got.tv_per_token, rel=1e-9, abs=1e-15)


def test_fuzzy_threshold_switches_at_the_slot_divergence():
    P_, Q_ = _slots()
    ts = _trace(P_, Q_)
    sa = spec.TraceArrays.from_split(ts)
    i = int(np.argmin(ts.slot_kl_pq))
    below = spec.position_terms(sa, tuning.thresholds("fuzzy_sd", sa, ts.slot_kl_pq[i] * 1.001))
    at = spec.position_terms(sa, tuning.thresholds("fuzzy_sd", sa, ts.slot_kl_pq[i]))
    assert below.alpha[i] == pytest.approx(1.0) and at.alpha[i] < 1.0   # strictly below T


def test_tuned_baselines_and_kernel_on_ngram_traces():
    """On the n-gram traces (top-k < vocabulary) the kernel and the numpy reference
    agree on both baselines across their grids, and both spend more along the grid."""
    sa = spec.TraceArrays.from_split(tracekit.split("valid"))
    for name in ("cactus", "fuzzy_sd"):
        grid = RULES[name].grid[::3]
        kern = tuning.scored(name, sa, grid)
        for v, k in zip(grid, kern):
            ref = tuning.evaluate(name, sa, v).objectives
            assert k.tokens == pytest.approx(ref.tokens_per_call, rel=1e-12)
            assert k.tv == pytest.approx(ref.tv_per_token, rel=1e-9, abs=1e-15)
        toks = [k.tokens for k in kern]
        assert toks == sorted(toks) and toks[-1] > toks[0]
        best = tuning.tune(name, sa, 0.01)
        assert best is not None and best.tv <= 0.01


def test_v2_splits_offer_slot_inputs_only_when_computable(tmp_path):
    ts = tracekit.split("test")
    v2 = T.TraceSplit({f: ts.columns[f] for f in T.ALL_FIELDS},
                      {k: v for k, v in ts.meta.items() if k != "vocab_classes"}, "v2")
    T.save(v2, tmp_path / "old.npz")
    sa = spec.TraceArrays.from_split(T.load(tmp_path / "old.npz"))
    assert sa.X.shape[0] == 9 and "old.npz: field 'slot_tv' is missing" in sa.missing
    assert "slot_tv" in tuning.scorable("cactus", sa)
    assert tuning.scorable("ears", sa) is None
    assert "cactus" not in {p.rule for p in tuning.sweep_all(sa)}
    prog = treeio.linearise([treeio.parse(RULES["fuzzy_sd"].tree())])
    with pytest.raises(DataError, match=r"old\.npz: field 'slot_tv' is missing"):
        spec.population_results(prog, sa)
    # a v2 split whose candidates are the whole vocabulary: computed, as recorded
    P_, Q_ = _slots()
    full = _trace(P_, Q_)
    old = T.TraceSplit({f: full.columns[f] for f in T.ALL_FIELDS}, dict(full.meta), "o")
    a, b = spec.TraceArrays.from_split(old), spec.TraceArrays.from_split(full)
    assert not a.missing and np.allclose(a.X, b.X, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("row, shift", [(2, 0.1), (5, -1e-6), (0, 2e-9)])
def test_slot_tv_that_contradicts_whole_candidates_is_refused(tmp_path, row, shift):
    """Where the candidates hold all of both distributions' mass (top-k = vocabulary,
    zero tails), slot_tv is their TV: a recorded value that differs by more than the
    tolerance is refused naming the file, the field and the row (it used to load
    without a word); within the tolerance it loads."""
    P_, Q_ = _slots()
    ts = _trace(P_, Q_)
    cols = {f: v.copy() for f, v in ts.columns.items()}
    cols["slot_tv"][row] = min(1.0, max(0.0, cols["slot_tv"][row] + shift))
    T.save(T.TraceSplit(cols, dict(ts.meta), "bad"), tmp_path / "bad.npz")
    with pytest.raises(DataError, match=rf"bad\.npz: field 'slot_tv' row {row}: differs from "
                                        "the TV of the candidates"):
        T.load(tmp_path / "bad.npz")
    cols["slot_tv"][row] = ts.columns["slot_tv"][row] + 1e-12         # rounding: accepted
    T.save(T.TraceSplit(cols, dict(ts.meta), "near"), tmp_path / "near.npz")
    T.load(tmp_path / "near.npz")


def test_primitive_set_and_code_offer_slot_inputs_as_asked():
    def terminals(pset):
        return set(pset.arguments)
    assert {"slot_tv", "slot_kl_pq", "slot_kl_qp"} <= terminals(P.make_pset(trace=True))
    assert not {"slot_tv", "slot_kl_pq"} & terminals(P.make_pset(trace=True, slots=False))
    assert "p_max" in terminals(P.make_pset(trace=True, slots=False))
    src = codegen.function_source(treeio.parse(RULES["cactus"].tree()), "f", trace=True)
    assert "q_max, slot_tv, slot_kl_pq, slot_kl_qp)" in src
    src = codegen.function_source(treeio.parse(RULES["ears"].tree()), "f", trace=True)
    assert "p_max, q_max):" in src
    ns = {}
    exec(codegen.module_source(treeio.parse(RULES["cactus"].tree(0.1)), "f", {}, "t",
                               trace=True).replace("from numba import njit", "njit = None")
         .replace("f_jit = njit(cache=True)(f)", ""), ns)
    assert ns["f"](0.5, 0.25, 0, 1.0, 1.0, False, 0, 0.5, 0.5, 0.2, 0.1, 0.1) == \
        pytest.approx(0.5 + 0.5 * 0.5)


def test_a_search_is_offered_the_slot_inputs_only_where_both_splits_have_them(tmp_path):
    from evolve.search.config import Config
    from evolve.search.engine import Evolution
    cfg = Config(generations=1, population=20, seed=1, objective="speed", tv_budget=0.02)
    tr, va = tracekit.split("train"), tracekit.split("valid")
    with_slots = Evolution(cfg, tr, va).pset.arguments
    assert {"slot_tv", "slot_kl_pq", "slot_kl_qp"} <= set(with_slots)
    old = T.TraceSplit({f: va.columns[f] for f in T.ALL_FIELDS}, dict(va.meta), "valid")
    assert not {"slot_tv", "slot_kl_pq", "slot_kl_qp"} & set(Evolution(cfg, tr, old).pset.arguments)


def test_decoders_and_emission_give_rules_the_slot_features():
    from evolve.data import emission as EM
    from evolve.rules.adapters import named_rule
    P_, Q_ = _slots()
    n, V = P_.shape
    f = DEC.slot_features(P_, Q_)
    z = np.zeros(n, np.int64)
    tv, _ = EM.slot_distortion(P_, Q_, z, z, named_rule("cactus", 0.1)[0], V)
    assert np.allclose(tv, np.minimum(0.1, f["slot_tv"]), atol=1e-13)
    T_ = float(np.median(f["slot_kl_pq"]))       # accept all where KL(p||q) < T: TV = slot TV
    tv, _ = EM.slot_distortion(P_, Q_, z, z, named_rule("fuzzy_sd", T_)[0], V)
    assert np.allclose(tv, np.where(f["slot_kl_pq"] < T_, f["slot_tv"], 0.0), atol=1e-13)
    # free-running: each block keeps the prefix the rule accepts with the recorded
    # uniforms, the rule reading the slot features the decoder computed
    pair = tracekit.pair()
    g = tracekit.TINY.block_size
    doc = np.frombuffer(pair.corpus.docs[pair.pools["test"][0]][:96], np.uint8)
    prompts = np.stack([doc[i:i + 32] for i in range(0, 64, 2)])
    for name, value in (("fuzzy_sd", 1.0), ("cactus", 0.05)):
        rngs = [np.random.default_rng(i) for i in range(len(prompts))]
        cols, acc = DEC.decode(pair, prompts, rngs, 6, rule=named_rule(name, value)[0])
        r = np.minimum(1.0, cols["target_prob"] / cols["draft_prob"])
        a = (np.where(cols["slot_kl_pq"] < value, 1.0, r) if name == "fuzzy_sd" else
             r + (1.0 - r) * np.minimum(1.0, value / cols["slot_tv"]))
        a = np.where(cols["draft_cand"] >= 0, a, r)
        ok = (cols["rand_value"] < a).reshape(-1, g)
        n_acc = np.where(ok.all(axis=1), g, np.argmin(ok, axis=1))
        assert np.array_equal(acc.reshape(-1), n_acc), name


def test_scalar_rules_take_the_slot_features_they_name():
    from evolve.rules.adapters import as_rule
    F = {"draft_prob": np.array([0.5, 0.4]), "target_prob": np.array([0.25, 0.4]),
         "position": np.array([0, 1]), "draft_entropy": np.ones(2),
         "target_entropy": np.ones(2), "top_token_match": np.array([False, True]),
         "block_position": np.array([0, 1]), "p_max": np.full(2, 0.5),
         "q_max": np.full(2, 0.5), "slot_tv": np.array([0.2, 0.0]),
         "slot_kl_pq": np.array([0.1, 0.0]), "slot_kl_qp": np.array([0.3, 0.0])}

    def nine(draft_prob, target_prob, position, draft_entropy, target_entropy,
             top_token_match, block_position, p_max, q_max):
        return target_prob / draft_prob

    def spend(draft_prob, target_prob, position, draft_entropy, target_entropy,
              top_token_match, block_position, p_max, q_max, slot_tv):
        return target_prob / draft_prob + slot_tv

    def kw(**f):
        return f["slot_kl_qp"]

    assert as_rule(nine).many(F).tolist() == [0.5, 1.0]          # written before v3: unchanged
    assert as_rule(spend).many(F).tolist() == [0.7, 1.0]
    assert as_rule(kw).many(F).tolist() == [0.3, 0.0]


def test_shards_keep_the_slot_features_and_a_sharded_search_is_offered_them(tmp_path):
    from evolve.cluster.session import Session
    from evolve.data import shard_writer, shards
    from evolve.search.config import Config
    from evolve.search.engine import Evolution
    for s in ("train", "valid"):
        ts = tracekit.split(s)
        shard_writer.write_split(ts, tmp_path / "v3" / s, 300)
        old = T.TraceSplit({f: ts.columns[f] for f in T.ALL_FIELDS}, dict(ts.meta), s)
        shard_writer.write_split(old, tmp_path / "v2" / s, 300)
    v3 = shards.open_split(tmp_path / "v3" / "valid")
    assert len(v3.shards) > 1 and v3.meta["format_version"] == 4     # with the ranks
    back = v3.concat()
    for f in T.V4_ALL_FIELDS:
        assert np.array_equal(back.columns[f], tracekit.split("valid").columns[f]), f
    v2 = shards.open_split(tmp_path / "v2" / "valid")
    assert v2.meta["format_version"] == 2 and not v2.concat().has_slot_features
    cfg = Config(generations=1, population=20, seed=1, objective="speed", tv_budget=0.02)
    for kind, offered in (("v3", True), ("v2", False)):
        sp = Session().attach({s: shards.open_split(tmp_path / kind / s)
                               for s in ("train", "valid")})
        args = set(Evolution(cfg, sp["train"], sp["valid"]).pset.arguments)
        assert ("slot_tv" in args) == offered and ("target_rank" in args) == offered, kind


def test_a_numpy_export_of_a_slot_rule_takes_the_slot_features():
    from evolve.export import modules
    nodes = treeio.parse(RULES["cactus"].tree(0.05))
    src = modules.export_source(nodes, "numpy", {"run": "t", "metrics": {}}, "test")
    ns = {}
    exec(compile(src, "<exported>", "exec"), ns)     # tests only, as a user imports it
    P_, Q_ = _slots()
    sa = spec.TraceArrays.from_split(_trace(P_, Q_))
    F = sa.features()
    h = ns["threshold"](*[F[f].reshape(-1) if f != "top_token_match"
                          else F[f].reshape(-1).astype(bool) for f in P.SLOT_SIGNATURE])
    assert np.allclose(h, tuning.thresholds("cactus", sa, 0.05), rtol=1e-15, atol=0)
