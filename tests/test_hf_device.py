"""The decoder's per-position computations on the device (evolve.data.sources.hf.device)
against their numpy definitions in evolve.data.decode: the same quantities to float64
rounding, and the same integers (samples, candidates, counts) exactly.

Also guarantee 31 of docs/reliability.md, Hugging Face decoding keeps its caches and
stays exact: see tests/test_hf_cache.py.

Also guarantee 32 of docs/reliability.md, The lookahead inputs: one definition, and
never silently absent: see tests/test_lookahead.py.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from evolve.data import decode as D  # noqa: E402
from evolve.data.sources.hf import device as DV  # noqa: E402
from evolve.rules.adapters import named_rule  # noqa: E402
from tests import hfkit  # noqa: E402

TOL = 1e-12
DEV = hfkit.test_device()      # torch's CPU, or the GPU with EVOLVE_TEST_ON_GPU=1


def T(a):
    """A numpy array as a tensor on the device the tests run on."""
    return torch.from_numpy(a).to(DEV)


def _pq(rows, V, seed, ties=False):
    rng = np.random.default_rng(seed)
    lp = rng.normal(0, 3, (rows, V))
    lq = rng.normal(0, 3, (rows, V))
    if ties:                       # equal logits: ties in q
        lq[:, :V // 2] = np.round(lq[:, :V // 2])
    t = lambda a: DV.probs(T(a), V, 0.8)  # noqa: E731
    P, Q = t(lp), t(lq)
    if ties:                       # p == q exactly at half the tokens, swapped pairs elsewhere
        h = V // 4 * 2
        P = Q.clone()
        P[:, 0:h:2], P[:, 1:h:2] = Q[:, 1:h:2], Q[:, 0:h:2]
    return P, Q


@pytest.mark.parametrize("V", [50, 5000], ids=["sort", "topk"])
def test_candidates_entropies_and_slot_features_are_the_numpy_ones(V):
    P, Q = _pq(24, V, 1, ties=V <= D.SORT_ALL_MAX_VOCAB)   # topk: which tie is kept may differ
    p, q = P.cpu().numpy(), Q.cpu().numpy()
    k = 7
    got, want = DV.candidates(P, Q, k), D.candidate_summary(p, q, k, token_dtype=np.int64)
    assert set(got) == set(want)
    for f in want:
        np.testing.assert_allclose(got[f].cpu().numpy(), want[f], rtol=0, atol=TOL, err_msg=f)
    np.testing.assert_allclose(DV.entropy(Q).cpu().numpy(), D.entropy(q), rtol=0, atol=TOL)
    sf, ref = DV.slot_features(P, Q), D.slot_features(p, q)
    assert set(sf) == set(ref)
    for f in ref:
        assert sf[f].cpu().numpy().dtype == ref[f].dtype, f
        np.testing.assert_allclose(sf[f].cpu().numpy(), ref[f], rtol=1e-12, atol=TOL, err_msg=f)
    assert (sf["slot_n_q_gt_p"].cpu().numpy() > 0).all() and (sf["slot_tv"].cpu().numpy() > 0).all()


def test_probs_sampling_and_residuals_are_the_numpy_ones():
    P, Q = _pq(200, 40, 2)
    rng = np.random.default_rng(3)
    u = rng.random(200)
    np.testing.assert_array_equal(DV.sample(P, T(u)).cpu().numpy(),
                                  D.sample_rows(P.cpu().numpy(), u))
    # a CDF entry equal to u * total: counted as <= (the token after it is drawn)
    E = torch.full((2, 40), 0.25, dtype=torch.float64, device=DEV)
    E[:, 4:] = 0.0
    half = torch.tensor([0.5, 0.25], dtype=torch.float64, device=DEV)
    np.testing.assert_array_equal(DV.sample(E, half).cpu().numpy(),
                                  D.sample_rows(E.cpu().numpy(), half.cpu().numpy()))
    assert DV.sample(E, half).tolist() == [2, 1]
    # a row with mass on its first ids only: never a token past the last with mass
    Z = torch.zeros((3, 40), dtype=torch.float64, device=DEV)
    Z[:, :4] = 0.25
    assert (DV.sample(Z, torch.tensor([0.0, 0.999999, 1.0], dtype=torch.float64, device=DEV)) <= 3).all()
    x = T(rng.integers(0, 40, 200))
    P[0] = Q[0]                                     # residual of mass 0: falls back to p
    for kind in (D.STANDARD, D.WITHOUT_DRAFT):
        got = DV.rejection_residual(kind, P, Q, x).cpu().numpy()
        want = D.rejection_residual(kind, P.cpu().numpy(), Q.cpu().numpy(), x.cpu().numpy())
        np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    np.testing.assert_array_equal(DV.rejection_residual(D.STANDARD, P, Q, x)[0].cpu().numpy(),
                                  P[0].cpu().numpy())
    ref = np.maximum(np.exp(np.arange(40) / 0.8 / 3) / np.exp(np.arange(40) / 0.8 / 3).sum(),
                     np.finfo(np.float64).tiny)
    got = DV.probs(torch.arange(40, dtype=torch.float32, device=DEV)[None] / 3, 40, 0.8)[0].cpu().numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-6)


@pytest.mark.parametrize("rule", ["leniency:0.5", "sglang_single:1.0", "cactus:0.05",
                                  "fuzzy_sd:0.5"])
def test_rule_acceptance_is_drafted_acceptance(rule):
    name, _, value = rule.partition(":")
    r = named_rule(name, float(value))[0]
    B, g, V, k = 6, 3, 30, 5
    P, Q = _pq(B * g, V, 4)
    rng = np.random.default_rng(5)
    X = T(rng.integers(0, V, (B, g)))
    X[:, 0] = Q.reshape(B, g, V)[:, 0].argmax(dim=1)       # some drafts in the top k
    gen = T(rng.integers(0, 9, B))
    F = DV.block_features(P, Q, X, gen, k)
    got = DV.rule_acceptance(r, F, B, g).cpu().numpy()
    p, q, x = P.cpu().numpy(), Q.cpu().numpy(), X.cpu().numpy()
    qx = np.take_along_axis(q, x.reshape(-1, 1), 1).reshape(B, g)
    px = np.take_along_axis(p, x.reshape(-1, 1), 1).reshape(B, g)
    cs = D.candidate_summary(p, q, k, token_dtype=np.int64)
    want = D.drafted_acceptance(r, p, q, x, qx, px, gen.cpu().numpy(), cs)
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    hit = F["draft_cand"].cpu().numpy() >= 0
    assert hit.any() and not hit.all()             # drafts in the top k and outside it


def test_tracked_distortion_on_the_device_is_the_emission_one():
    from evolve.data.emission import slot_distortion
    B, g, V, k = 5, 3, 40, 6
    P, Q = _pq(B * g, V, 6)
    X = T(np.random.default_rng(7).integers(0, V, (B, g)))
    gen = torch.arange(B, device=DEV) * 2
    F = DV.block_features(P, Q, X, gen, k)
    idx = torch.tensor([0, 1, 4, 7, 8, 14], device=DEV)
    pos, bpos = F["position"][idx].cpu().numpy(), F["block_position"][idx].cpu().numpy()
    for name, value in (("leniency", 0.5), ("cactus", 0.05), ("fuzzy_sd", 0.5),
                        ("leniency", 1.0)):            # the last: standard, checked below
        rule = named_rule(name, value)[0]
        tv, kl = DV.slot_distortion(P, Q, F, idx, rule)
        want_tv, want_kl = slot_distortion(P[idx].cpu().numpy(), Q[idx].cpu().numpy(), pos, bpos, rule, k)
        np.testing.assert_allclose(tv.cpu().numpy(), want_tv, rtol=1e-9, atol=TOL)
        np.testing.assert_allclose(kl.cpu().numpy(), want_kl, rtol=1e-9, atol=TOL)
    assert (want_tv < 1e-12).all() and (tv.cpu().numpy() < 1e-12).all()    # leniency 1: standard
    lenient = DV.slot_distortion(P, Q, F, idx, named_rule("leniency", 0.5)[0])[0]
    assert lenient.max() > 1e-3
    # an engine's knob judges every token: the numpy path
    assert DV.slot_distortion(P, Q, F, idx, named_rule("sglang_single", 1.0)[0]) is None


# ------------------------------------------------------------- the lookahead inputs

AHEAD_TREE = ("pmin(1.0, pdiv(target_prob, mul(draft_prob, "
              "sub(1.0, mul(0.1, sub(ahead, next_tv))))))")


@pytest.mark.parametrize("g", [1, 2, 3, 6])
def test_lookahead_on_the_device_is_the_numpy_one_bit_for_bit(g):
    rng = np.random.default_rng(10 + g)
    tv = rng.random(9 * g) ** 3                  # many decimals: rounding shows
    tv[::4] = 0.0
    got = DV.lookahead_features(T(tv), g)
    want = D.lookahead_features(tv, g)
    assert set(got) == set(want) == {"next_tv", "ahead"}
    for f in want:
        assert got[f].dtype == torch.float64, f
        np.testing.assert_array_equal(got[f].cpu().numpy(), want[f], err_msg=f)
    # the block's features carry them, from its own slot TVs, and traces do not record them
    B, V, k = 4, 30, 5
    P, Q = _pq(B * g, V, 12)
    X = T(rng.integers(0, V, (B, g)))
    F = DV.block_features(P, Q, X, torch.zeros(B, dtype=torch.int64, device=DEV), k)
    want = D.lookahead_features(F["slot_tv"].cpu().numpy(), g)
    for f in want:
        np.testing.assert_array_equal(F[f].cpu().numpy(), want[f], err_msg=f)
    assert set(want) <= set(DV.RECORD_SKIPS) and set(want) <= set(DV.ALL_INPUT_NAMES)


def test_a_lookahead_rule_decides_and_is_tracked_as_in_numpy():
    from evolve.data import emission as EM
    from evolve.data.sources.hf import decode as hf_decode
    from evolve.rules.adapters import tree_rule
    rule = tree_rule(AHEAD_TREE)
    B, g, V, k = 6, 4, 30, 5
    P, Q = _pq(B * g, V, 13)
    rng = np.random.default_rng(14)
    X = T(rng.integers(0, V, (B, g)))
    X[:, :2] = Q.reshape(B, g, V)[:, :2].argmax(dim=2)      # drafts in the top k
    gen = T(rng.integers(0, 9, B))
    F = DV.block_features(P, Q, X, gen, k)
    p, q, x = P.cpu().numpy(), Q.cpu().numpy(), X.cpu().numpy()
    qx = np.take_along_axis(q, x.reshape(-1, 1), 1).reshape(B, g)
    px = np.take_along_axis(p, x.reshape(-1, 1), 1).reshape(B, g)
    cs = D.candidate_summary(p, q, k, token_dtype=np.int64)
    want = D.drafted_acceptance(rule, p, q, x, qx, px, gen.cpu().numpy(), cs)
    got = DV.rule_acceptance(rule, F, B, g).cpu().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    std = np.minimum(1.0, px / qx)
    assert np.abs(want - std).max() > 1e-3         # the lookahead changes decisions
    # the exact distortion at reached slots: on the device, and the numpy path of a rule
    # that judges every draft, each with the path's lookahead held for every token
    n_acc = torch.tensor([0, 1, 2, 3, 4, 1], device=DEV)
    reached = np.flatnonzero(np.tile(np.arange(g), B) <= np.repeat(n_acc.cpu().numpy(), g))
    look = {f: F[f].cpu().numpy()[reached] for f in ("next_tv", "ahead")}
    pos, bpos = F["position"].cpu().numpy()[reached], F["block_position"].cpu().numpy()[reached]
    for scope in ("top_k", "vocabulary"):
        rule.scope = scope
        tr = {f: [] for f in hf_decode.TRACKED}
        hf_decode._track(tr, P, Q, F, gen, n_acc, rule, k, 0, 0)
        want_tv, want_kl = EM.slot_distortion(p[reached], q[reached], pos, bpos, rule, k, look)
        np.testing.assert_allclose(tr["tv"][0], want_tv, rtol=1e-9, atol=TOL, err_msg=scope)
        np.testing.assert_allclose(tr["kl"][0], want_kl, rtol=1e-9, atol=TOL, err_msg=scope)
        assert want_tv.max() > 1e-3
