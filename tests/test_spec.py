"""Exact objectives: brute-force enumeration, identities, kernel vs numpy reference."""

import dataclasses
import itertools

import numpy as np
import pytest

from evolve.kernels import tokens as kernels
from evolve.cli import views
from evolve.rules import tuning as pareto
from evolve.rules.table import RULES
from tests import rulefns
from evolve.freerun import simulate as S
from evolve.objectives import spec
from evolve.kernels import speculative as spec_kernels
from evolve.data import decode as DEC
from evolve.lang import randtrees, treeio
from evolve.lang import primitives as P
from heuristics import baselines as HB
from tests import tracekit

# ------------------------------------------------------------ a toy world
# Block size g, vocabulary V; p and q depend on the drafted prefix; a rule is an
# arbitrary threshold table h(prefix, x), including values outside [0, 1].


class Toy:
    def __init__(self, V=4, g=3, seed=0, k=None, equal_at=()):
        rng = np.random.default_rng(seed)
        self.V, self.g, self.k = V, g, (V if k is None else k)
        self.prefixes = [pre for n in range(g) for pre in itertools.product(range(V), repeat=n)]
        self.p, self.q, self.h = {}, {}, {}
        for pre in self.prefixes:
            self.q[pre] = rng.dirichlet(np.ones(V))
            self.p[pre] = self.q[pre].copy() if pre in equal_at else rng.dirichlet(np.ones(V) * 0.7)
            self.h[pre] = rng.uniform(-0.3, 1.3, V)

    def accept(self, pre, h=None):
        """a(x) of the top-k restricted rule at a prefix."""
        p, q = self.p[pre], self.q[pre]
        hh = self.h[pre] if h is None else h(pre)
        a = np.clip(hh, 0.0, 1.0)
        top = np.argsort(-q, kind="stable")[:self.k]
        std = np.minimum(1.0, p / q)
        mask = np.zeros(self.V, bool)
        mask[top] = True
        return np.where(mask, a, std)

    def out(self, pre, a):
        """The emitted byte's distribution, by the two-stage process, summed term by term."""
        p, q = self.p[pre], self.q[pre]
        r = np.maximum(p - q, 0.0)
        r = p.copy() if r.sum() < spec.RESIDUAL_EPS else r / r.sum()
        o = np.zeros(self.V)
        for x in range(self.V):
            o[x] += q[x] * a[x]                 # x drafted and accepted
            for y in range(self.V):
                o[y] += q[x] * (1 - a[x]) * r[y]  # x drafted, rejected, y resampled
        return o

    def truth(self, h=None):
        """Directly, over every drafted prefix: E[tokens], E[sum TV], E[sum KL] of a block.

        P(reach position j+1 with prefix x_1..x_j) = prod_i q(x_i) a(x_i); the byte
        emitted there is distributed as out(prefix).
        """
        tok, tv, kl = 1.0, 0.0, 0.0
        for pre in self.prefixes:
            w = 1.0
            for i in range(len(pre)):
                w *= self.q[pre[:i]][pre[i]] * self.accept(pre[:i], h)[pre[i]]
            a = self.accept(pre, h)
            o = self.out(pre, a)
            p = self.p[pre]
            tok += w * float((self.q[pre] * a).sum())
            tv += w * 0.5 * float(np.abs(o - p).sum())
            kl += w * float(sum(o[x] * np.log(o[x] / p[x]) for x in range(self.V) if o[x] > 0))
        return tok, tv, kl

    def arrays(self, h=None):
        """TraceArrays with one block per possible recorded draft sequence, and weights."""
        rows = []
        weights = []
        for seq in itertools.product(range(self.V), repeat=self.g):
            weights.append(np.prod([self.q[seq[:i]][seq[i]] for i in range(self.g)]))
            for j in range(self.g):
                rows.append((seq[:j], seq[j]))
        n, k = len(rows), self.k
        Pm = np.array([self.p[pre] for pre, _ in rows])
        Qm = np.array([self.q[pre] for pre, _ in rows])
        cs = DEC.candidate_summary(Pm, Qm, k)
        Hm = np.array([(self.h[pre] if h is None else h(pre)) for pre, _ in rows])
        x = np.array([x for _, x in rows])
        ct = cs["cand_token"].astype(np.int64)
        hit = ct == x[:, None]
        dcand = np.where(hit.any(1), np.argmax(hit, 1), -1)
        r = np.arange(n)
        sa = spec.TraceArrays(self.g, k, n, np.zeros((spec.N_FEATURES, n * k)),
                             cs["cand_draft_prob"].reshape(-1), cs["cand_target_prob"].reshape(-1),
                             cs["tail_draft_prob"], cs["tail_target_prob"],
                             cs["tail_excess_draft_prob"], cs["tail_excess_target_prob"],
                             dcand, np.minimum(1.0, Pm[r, x] / Qm[r, x]))
        hc = np.take_along_axis(Hm, ct, axis=1).reshape(-1)
        return sa, hc, np.array(weights)


def _weighted(sa, h, w):
    b = spec.block_sums(sa, spec.position_terms(sa, h))
    return (w * b["tokens"]).sum(), (w * b["tv"]).sum(), (w * b["kl"]).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_offline_estimator_is_exact_in_expectation(seed):
    """Averaged over every recordable draft sequence (weighted by its probability),
    the Rao-Blackwellised block estimates equal the brute-force expectations."""
    toy = Toy(seed=seed)
    sa, h, w = toy.arrays()
    assert abs(w.sum() - 1) < 1e-12
    tok, tv, kl = _weighted(sa, h, w)
    t_tok, t_tv, t_kl = toy.truth()
    assert tok == pytest.approx(t_tok, abs=1e-12)
    assert tv == pytest.approx(t_tv, abs=1e-12)
    assert kl == pytest.approx(t_kl, abs=1e-12)


@pytest.mark.parametrize("seed", [3, 4])
def test_top_k_tail_is_exact_for_acceptance_and_tv(seed):
    """With k < V the tail uses the standard rule; tokens and TV stay exact, KL is a
    lower bound (merged tail bins)."""
    toy = Toy(V=5, g=2, seed=seed, k=2)
    sa, h, w = toy.arrays()
    tok, tv, kl = _weighted(sa, h, w)
    t_tok, t_tv, t_kl = toy.truth()
    assert tok == pytest.approx(t_tok, abs=1e-12)
    assert tv == pytest.approx(t_tv, abs=1e-12)
    assert kl <= t_kl + 1e-12


def test_p_equal_q_falls_back_to_p():
    toy = Toy(V=3, g=2, seed=5, equal_at={()})
    sa, h, w = toy.arrays()
    tok, tv, kl = _weighted(sa, h, w)
    t_tok, t_tv, t_kl = toy.truth()
    assert (tok, tv, kl) == pytest.approx((t_tok, t_tv, t_kl), abs=1e-12)


def test_constant_acceptance_matches_the_closed_form():
    """p, q the same at every prefix and a rule with constant acceptance a:
    tokens = (1 - a^(g+1)) / (1 - a), gain = that / (g c + 1)."""
    g = 4
    toy = Toy(V=3, g=g, seed=6)
    q = np.array([0.5, 0.3, 0.2])
    p = np.array([0.2, 0.3, 0.5])
    for pre in toy.prefixes:
        toy.p[pre], toy.q[pre] = p, q
    a = 0.6
    sa, h, w = toy.arrays(h=lambda pre: np.full(3, a))
    tok, _, _ = _weighted(sa, h, w)
    assert tok == pytest.approx((1 - a ** (g + 1)) / (1 - a), abs=1e-12)
    b = spec.block_sums(sa, spec.position_terms(sa, h))
    assert np.allclose(b["tokens"], (1 - a ** (g + 1)) / (1 - a), rtol=0, atol=1e-12)
    obj = spec.objectives(sa, h)
    c = 0.1
    assert obj.gain(c) == pytest.approx((1 - a ** (g + 1)) / ((1 - a) * (g * c + 1)), abs=1e-12)
    assert obj.acceptance == pytest.approx((a,) * g, abs=1e-12)
    std = spec.objectives(sa, np.minimum(1.0, sa.cp / sa.cq))
    assert std.tv_per_token < 1e-12
    # standard acceptance is sum min(p, q) = 0.2 + 0.3 + 0.2
    assert std.acceptance == pytest.approx((0.7,) * g, abs=1e-12)


# ----------------------------------------------------- identities on traces

@pytest.fixture(scope="module")
def sa():
    return spec.TraceArrays.from_split(tracekit.split("valid"))


def test_standard_rule_has_no_distortion(sa):
    t = spec.position_terms(sa, spec.rule_thresholds(rulefns.standard, sa))
    assert np.abs(t.tv).max() <= 1e-12
    assert np.abs(t.kl).max() <= 1e-12
    assert np.abs(t.extra).max() <= 1e-12
    cp = sa.cp.reshape(sa.n, sa.k)
    assert np.abs(t.out - cp).max() <= 1e-12
    o = spec.objectives(sa, spec.rule_thresholds(rulefns.standard, sa))
    assert o.tv_per_token <= 1e-12 and o.kl_per_token <= 1e-12


@pytest.mark.parametrize("name, param", [("leniency", 0.5), ("leniency", 0.1), ("ears", 0.3),
                                         ("ears", 1.0)])
def test_tv_equals_extra_acceptance_mass_for_lenient_rules(sa, name, param):
    h = spec.rule_thresholds(rulefns.fn(name), sa, **{RULES[name].param: param})
    t = spec.position_terms(sa, h)
    assert (t.extra >= -1e-15).all()
    assert np.abs(t.tv - t.extra).max() <= 1e-12
    assert (t.tv > 1e-4).mean() > 0.5


def test_identity_fails_for_rules_that_also_reject(sa):
    """BiLD and typical acceptance reject some tokens the standard rule keeps: the
    output moves both ways and TV exceeds the net extra mass."""
    for name in ("bild_rollback", "typical_acceptance"):
        t = spec.position_terms(sa, spec.rule_thresholds(rulefns.fn(name), sa))
        assert (t.tv - t.extra > 1e-3).any()


def test_output_distribution_is_a_distribution(sa):
    h = np.random.default_rng(0).uniform(-0.5, 1.5, sa.n * sa.k)
    t = spec.position_terms(sa, h)
    tot = t.out.sum(axis=1) + t.out_tail.sum(axis=1)
    assert np.abs(tot - 1).max() < 1e-12
    assert (t.out >= 0).all() and (t.tv <= 1 + 1e-12).all() and (t.kl >= 0).all()


def test_vector_rules_equal_the_scalar_baselines(sa):
    pairs = [(rulefns.standard, {}, HB.standard_rejection),
             (rulefns.leniency, {"l": 0.5}, HB.leniency),
             (rulefns.typical, {"eps": 0.09}, HB.typical_acceptance),
             (rulefns.bild, {"alpha": 5.0}, HB.bild_rollback)]
    for fn, kw, scalar in pairs:
        v = spec.rule_thresholds(fn, sa, **kw)
        s = S.offline_thresholds(scalar, sa)
        assert np.allclose(v, s, rtol=1e-15, atol=0), scalar.__name__


def test_candidate_matrix_layout():
    ts = tracekit.split("valid")
    sa = spec.TraceArrays.from_split(ts)
    assert spec.FEATURES[:6] == P.INPUT_NAMES
    assert sa.X.shape == (16, len(ts) * ts.top_k) and sa.X.flags.c_contiguous
    assert not np.isnan(sa.X).any()            # the trace world's rows: no empty one
    F = sa.features()
    i = 37
    assert (F["slot_kl_qp"][i] == ts.slot_kl_qp[i]).all() and not sa.missing
    c = ts.draft_cand[i]
    if c >= 0:
        assert F["draft_prob"][i, c] == ts.draft_prob[i]
        assert F["top_token_match"][i, c] == float(ts.top_token_match[i])
    assert (F["block_position"][i] == ts.block_position[i]).all()
    assert (F["q_max"][:, 0] == F["draft_prob"][:, 0]).all()
    assert (F["top_token_match"].sum(axis=1) <= 1).all()


# ------------------------------------------------------ kernel vs reference

def _program(tokens):
    """A Programs object from reversed-prefix (opcode, const) tokens, for inputs 6..8."""
    ops = np.array([t[0] for t in tokens], dtype=np.int32)
    consts = np.array([t[1] if len(t) > 1 else 0.0 for t in tokens], dtype=np.float64)
    return treeio.Programs(ops, consts, np.array([0], np.int64), np.array([len(ops)], np.int64), 4)


def _random_trees(n, seed):
    return [str(t) for t in randtrees.deap_trees(P.make_pset(), n, seed, 1, 5)]


def test_kernel_matches_numpy_reference(sa):
    SEED_TREES = {n: r.tree() for n, r in RULES.items() if r.data == "tokens"}
    trees = list(SEED_TREES.values()) + _random_trees(40, 11)
    progs = treeio.linearise([treeio.parse(t) for t in trees])
    sums = spec_kernels.population_objectives(progs, sa)
    h_all = kernels.matrix_thresholds(progs, sa.X)
    for i, t in enumerate(trees):
        ref = spec.objectives(sa, h_all[i])
        got = spec.objectives_from_sums(sums[i], sa.n_blocks, sa.g)
        for f in ("tokens_per_call", "tv_per_token", "kl_per_token", "extra_per_token",
                  "tokens_se"):
            assert getattr(got, f) == pytest.approx(getattr(ref, f), rel=1e-9, abs=1e-12), (t, f)
        assert got.acceptance == pytest.approx(ref.acceptance, rel=1e-9)
        assert got.reach == pytest.approx(ref.reach, rel=1e-12)
        assert got.tv_by_position == pytest.approx(ref.tv_by_position, rel=1e-9, abs=1e-12)


def test_kernel_reads_inputs_6_to_8(sa):
    """EARS (needs p_max = input 7) and a block-position rule as raw programs."""
    ADD, MUL, SUB, PMIN, PDIV, LT, ITE = (P.OP[n] for n in ("add", "mul", "sub", "pmin", "pdiv",
                                                             "lt", "ite"))
    C = P.OP_CONST
    # pmin(1, add(pdiv(t, d), mul(0.3, sub(1, p_max)))) in reversed prefix order
    ears = _program([(7,), (C, 1.0), (SUB,), (C, 0.3), (MUL,), (0,), (1,), (PDIV,), (ADD,),
                     (C, 1.0), (PMIN,)])
    got = spec.population_results(ears, sa)[0]
    ref = spec.objectives(sa, spec.rule_thresholds(rulefns.ears, sa, beta=0.3))
    assert got.tokens_per_call == pytest.approx(ref.tokens_per_call, rel=1e-12)
    assert got.tv_per_token == pytest.approx(ref.tv_per_token, rel=1e-9)
    # ite(lt(block_position, 0.5), 1.0, pmin(1, pdiv(t, d))): accept everything at position 0
    prog = _program([(0,), (1,), (PDIV,), (C, 1.0), (PMIN,), (C, 1.0), (C, 0.5), (6,), (LT,),
                     (ITE,)])
    got = spec.population_results(prog, sa)[0]
    F = sa.features()
    h = np.where(F["block_position"] < 0.5, 1.0, np.minimum(1.0, F["target_prob"] / F["draft_prob"]))
    ref = spec.objectives(sa, h.reshape(-1))
    assert got.tokens_per_call == pytest.approx(ref.tokens_per_call, rel=1e-12)
    assert got.acceptance == pytest.approx(ref.acceptance, rel=1e-12)
    std = spec.objectives(sa, spec.rule_thresholds(rulefns.standard, sa))
    assert got.acceptance[0] > std.acceptance[0] + 0.1
    assert got.tv_per_token == pytest.approx(ref.tv_per_token, rel=1e-9)
    bad = _program([(9,), (C, 1.0), (PMIN,)])      # slot_tv: not in a nine-row matrix
    nine = dataclasses.replace(sa, X=np.ascontiguousarray(sa.X[:9]))
    with pytest.raises(ValueError, match="opcode 9"):
        spec_kernels.population_objectives(bad, nine)


def test_kernel_is_thread_count_independent(sa):
    import numba
    progs = treeio.linearise([treeio.parse(t) for t in _random_trees(16, 5)])
    a = spec_kernels.population_objectives(progs, sa)
    old = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        b = spec_kernels.population_objectives(progs, sa)
    finally:
        numba.set_num_threads(old)
    assert np.array_equal(a, b)
    h = spec.rule_thresholds(rulefns.leniency, sa, l=0.4)
    assert spec.threshold_objectives(h, sa).tokens_per_call == pytest.approx(
        spec.objectives(sa, h).tokens_per_call, rel=1e-12)


def test_kernel_sums_do_not_depend_on_program_grouping(sa, monkeypatch):
    """Programs are scored in groups sharing each tile: any group size, and a program
    alone, give the same integers (a population that is not a multiple of the group)."""
    trees = _random_trees(37, 7)
    progs = treeio.linearise([treeio.parse(t) for t in trees])
    monkeypatch.setattr(spec_kernels, "GROUP", 1)
    a = spec_kernels.population_sums(progs, sa)
    monkeypatch.setattr(spec_kernels, "GROUP", 3)
    b = spec_kernels.population_sums(progs, sa)
    monkeypatch.setattr(spec_kernels, "GROUP", 8)
    c = spec_kernels.population_sums(progs, sa)
    alone = spec_kernels.population_sums(treeio.linearise([treeio.parse(trees[5])]), sa)
    assert np.array_equal(a, b) and np.array_equal(a, c)
    assert np.array_equal(a[5:6], alone)


def test_kernel_sums_do_not_depend_on_the_tile_layout(sa):
    """The sums' vector lanes are the blocks of a tile (``TILE_BLOCKS`` a tile, the
    last one partial): a split of any block count gives the exact total of its
    blocks scored one at a time, whatever tile a block falls in."""
    from evolve.kernels import fixed
    progs = treeio.linearise([treeio.parse(t) for t in _random_trees(9, 11)])
    tb = spec_kernels.TILE_BLOCKS
    for n in (1, tb - 1, tb + 3, min(sa.n_blocks, 2 * tb + 5)):
        part = sa.blocks(np.arange(n))
        alone = fixed.total(spec_kernels.population_sums(progs, part.blocks([b]))
                            for b in range(n))
        assert np.array_equal(spec_kernels.population_sums(progs, part), alone), n


def test_kernel_clips_nan_inf_and_signed_zero_like_the_reference(sa):
    """Thresholds outside [0, 1]: NaN and -inf and -0.0 accept nothing, +inf and 2.0
    accept surely; the kernel's branch-free clip gives the bits of the clipped array."""
    rng = np.random.default_rng(3)
    h = rng.random(sa.n * sa.k) * 1.4 - 0.2
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.0, 2.0, -5.0, 5e-324, -5e-324])
    h[rng.integers(0, h.size, 4000)] = rng.choice(specials, 4000)
    clipped = np.where(np.isnan(h), 0.0, np.clip(h, 0.0, 1.0)) + 0.0
    got = spec.threshold_objectives(h, sa)
    assert got == spec.threshold_objectives(clipped, sa)
    ref = spec.objectives(sa, clipped)
    assert got.tokens_per_call == pytest.approx(ref.tokens_per_call, rel=1e-12)
    assert got.tv_per_token == pytest.approx(ref.tv_per_token, rel=1e-9)
    assert np.isfinite(got.tokens_per_call) and np.isfinite(got.kl_per_token)


def test_kernel_tail_reach_matches_the_reference_and_the_p99(sa):
    """The last kernel sum is the reach of the slots with TV > cap: the reference's
    reach-weighted count, and "at most 1% of the reach over C" iff "p99 <= C"."""
    trees = list(_random_trees(12, 21)) + [RULES["leniency"].tree(0.4)]
    progs = treeio.linearise([treeio.parse(t) for t in trees])
    h_all = kernels.matrix_thresholds(progs, sa.X)
    untailed = spec_kernels.population_sums(progs, sa)
    for cap in (0.02, 0.1, 0.3):
        sums = spec_kernels.population_objectives(progs, sa, tail_cap=cap)
        assert np.array_equal(spec_kernels.population_sums(progs, sa, tail_cap=cap)[:, :-1],
                              untailed[:, :-1])        # the other sums do not move
        for i in range(len(trees)):
            terms = spec.position_terms(sa, h_all[i])
            W = spec.block_sums(sa, terms)["W"].reshape(-1)
            assert sums[i, -1] == pytest.approx(W[terms.tv > cap].sum(), rel=1e-12, abs=1e-12)
            share = sums[i, -1] / W.sum()
            p99 = spec.weighted_quantile(terms.tv, W, 0.99)
            assert (share <= spec.TAIL_SHARE) == (p99 <= cap), (trees[i], cap, share, p99)
    assert not untailed[:, -1].any()                    # no cap: no tail


# ---------------------------------------------------------------- baselines

def test_sweeps_tuning_and_front(sa):
    pts = pareto.sweep_all(sa)
    std = pareto.evaluate("standard_rejection", sa)
    assert std.tv < 1e-12
    len_pts = pareto.sweep("leniency", sa)
    toks = [p.tokens for p in len_pts]
    assert toks == sorted(toks)                      # smaller l: more tokens ...
    assert [p.tv for p in len_pts] == sorted(p.tv for p in len_pts)   # ... and more TV
    assert len_pts[0].tokens == pytest.approx(std.tokens, rel=1e-12)
    best = pareto.tune("leniency", sa, budget=0.03)
    assert best.tv <= 0.03
    assert all(p.tv > 0.03 or p.tokens <= best.tokens for p in len_pts)
    assert pareto.tune("bild_rollback", sa, budget=1e-6) is None
    front = pareto.pareto_front(pts)
    assert all(not (q.tv <= p.tv and q.tokens >= p.tokens and (q.tv, q.tokens) != (p.tv, p.tokens))
               for p in front for q in pts)
    text = views.render_text(pareto.series_of(pts), width=40, height=10)
    assert "tokens per call" in text and "leniency" in text
    rep = pareto.tuned_report("ears", sa, sa, 0.02)
    assert rep["valid"] == rep["test"]


def test_slot_tv_by_position_and_p99_from_first_principles(sa):
    """tv_by_position is the reach-weighted mean slot TV at each block position,
    and tv_p99 the reach-weighted 99th percentile, recomputed here by hand."""
    h = spec.rule_thresholds(rulefns.leniency, sa, l=0.6)
    terms = spec.position_terms(sa, h)
    o = spec.objectives_from_terms(sa, terms)
    W = spec.block_sums(sa, terms)["W"]
    tv = terms.tv.reshape(sa.n_blocks, sa.g)
    for j in range(sa.g):
        assert o.tv_by_position[j] == pytest.approx((W[:, j] * tv[:, j]).sum() / W[:, j].sum())
    # weighted quantile by replicating rows in proportion to weights (integer weights)
    w = np.round(W.reshape(-1) * 4).astype(int)
    rep = np.repeat(terms.tv, w)
    assert spec.weighted_quantile(terms.tv, w, 0.99) == np.sort(rep)[int(np.ceil(0.99 * rep.size)) - 1]
    assert 0 < o.tv_p99 <= terms.tv.max()
    std = spec.objectives(sa, spec.rule_thresholds(rulefns.standard, sa))
    assert std.tv_p99 < 1e-12 and max(std.tv_by_position) < 1e-12
