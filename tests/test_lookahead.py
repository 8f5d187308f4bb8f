"""The lookahead inputs (next_tv, ahead; evolve.data.decode.lookahead_features) as the
decoders hand them to rules: the definition against a brute-force sum, the n-gram
decoder's values against the block's full distributions and against the trace
objectives' input matrix on the same path, the exact emission at a slot, and a paired
free-running comparison of a rule that reads them. (The Hugging Face decoder's device
version: tests/test_hf_device.py.)

Guarantee 32 of docs/reliability.md, The lookahead inputs: one definition, and never silently absent:

`next_tv` and `ahead` (`evolve run --lookahead`) are computed in one place from a
block's slot TVs (`evolve/data/decode.py` `lookahead_features`;
`tests/test_lookahead.py` holds it to the sum of products it stands for). The trace
objectives derive them from the recorded slot TVs (traces never store them), and
both decoders hand a rule those of the block's real later slots along the drafted
tokens: the n-gram decoder in numpy, the Hugging Face one on its device in float64
with the same operations in the same order, so the same slot TVs give the same bits
(`tests/test_hf_device.py`). Tests check that the objectives' input rows equal what
the decoder hands a rule on the same recorded path. The exact emission at a slot
(`evolve/data/emission.py`, used by `simulate --compare` and the paired comparison)
gives every token of the vocabulary the slot's values from the path, so a rule's
tracked TV and KL are exact given the block's later slots. A caller that passes no
lookahead values for a rule that reads them gets one line naming `lookahead` and the
rule, and a wrong shape names the input and both shapes: never zeros or NaNs that
clipping would turn into acceptance probabilities. Since these inputs follow the
token drafted at the slot, a champion that reads them says in `champion.json`
(`estimate`) and in the run's table that its offline numbers hold them at the
recorded draft's values for every candidate; the free-running comparison is the
measurement. `--lookahead` on token splits, or on traces without slot features, is
one line naming `lookahead`, exit code 2, before a run directory is made
(`tests/test_lookahead_search.py`).
"""

import numpy as np
import pytest

from evolve.freerun import paired
from evolve.data.sources import ngram as NG, ngram_free
from evolve.data import decode as DEC
from evolve.data import emission as EM
from evolve.data import lookahead_emission as LE
from evolve.data import traces as T
from evolve.errors import EvolveError
from evolve.objectives import spec
from evolve.rules.adapters import as_rule, named_rule, tree_rule
from tests import tracekit

# decisions that follow the later slots: more lenient where the block ahead looks good
AHEAD_TREE = ("pmin(1.0, pdiv(target_prob, mul(draft_prob, "
              "sub(1.0, mul(0.1, sub(ahead, next_tv))))))")
STANDARD_TREE = "pmax(pmin(1.0, pdiv(target_prob, draft_prob)), mul(0.0, add(ahead, next_tv)))"


def brute_lookahead(tv, g):
    """Per row, by the definition: the next slot's TV, and the sum over m > j of
    prod over j < i <= m of (1 - TV_i), in Python floats."""
    nxt, ahead = [], []
    for b in range(len(tv) // g):
        t = [float(x) for x in tv[b * g:(b + 1) * g]]
        for j in range(g):
            nxt.append(t[j + 1] if j + 1 < g else 0.0)
            total = 0.0
            for m in range(j + 1, g):
                prod = 1.0
                for i in range(j + 1, m + 1):
                    prod *= 1.0 - t[i]
                total += prod
            ahead.append(total)
    return np.array(nxt), np.array(ahead)


@pytest.mark.parametrize("g", [1, 2, 3, 4, 5, 6])
def test_lookahead_features_are_the_brute_force_sum(g):
    rng = np.random.default_rng(g)
    tv = rng.random(7 * g)
    tv[::5] = 0.0                                  # exact agreement and full disagreement
    tv[3::7] = 1.0
    got = DEC.lookahead_features(tv, g)
    nxt, ahead = brute_lookahead(tv, g)
    np.testing.assert_array_equal(got["next_tv"], nxt)
    np.testing.assert_allclose(got["ahead"], ahead, rtol=1e-13, atol=1e-15)
    last = np.arange(tv.size) % g == g - 1
    assert (got["next_tv"][last] == 0.0).all() and (got["ahead"][last] == 0.0).all()
    if g > 1:       # all later slots agree (TV 0): every later draft is accepted
        assert DEC.lookahead_features(np.zeros(g), g)["ahead"].tolist() == \
            [float(g - 1 - j) for j in range(g)]


class Spy:
    """A rule that records the lookahead and slot inputs it is handed, deciding as
    ``rule`` does."""

    def __init__(self, rule):
        self.rule = rule
        self.name = "spy"
        self.seen = []

    def many(self, F):
        self.seen.append({f: np.array(F[f]) for f in ("next_tv", "ahead", "slot_tv",
                                                       "block_position")})
        return self.rule.many(F)


def _prompts(pair, n=20, start=0):
    doc = np.frombuffer(pair.corpus.docs[pair.pools["test"][0]][:200], np.uint8)
    C = pair.config.context_len
    return np.stack([doc[i:i + C + 8] for i in range(start, start + 2 * n, 2)])


def _seen(spy, n, blocks, g):
    """The spy's values, one call per block of a single batch (rows b g + j), as
    columns in the decoder's record order (sequence, block, position)."""
    assert len(spy.seen) == blocks
    return {f: np.stack([s[f].reshape(n, g) for s in spy.seen], axis=1).reshape(-1)
            for f in spy.seen[0]}


def test_ngram_decoder_hands_rules_the_lookahead_of_the_blocks_full_distributions():
    pair = tracekit.pair()
    g, blocks = pair.config.block_size, 4
    pr = _prompts(pair)
    n = len(pr)
    spy = Spy(tree_rule(AHEAD_TREE))
    cols, acc = DEC.decode(pair, pr, [np.random.default_rng(i) for i in range(n)], blocks,
                           rule=spy)
    seen = _seen(spy, n, blocks, g)
    ctx = cols["context"]
    tv = DEC.slot_features(pair.target.probs(ctx), pair.draft.probs(ctx))["slot_tv"]
    np.testing.assert_allclose(tv, cols["slot_tv"], rtol=0, atol=1e-15)
    want = DEC.lookahead_features(tv, g)
    for f in ("next_tv", "ahead"):
        np.testing.assert_allclose(seen[f], want[f], rtol=0, atol=1e-14, err_msg=f)
    np.testing.assert_array_equal(seen["block_position"], cols["block_position"])
    assert seen["ahead"].max() > 0.5 and (seen["ahead"][cols["block_position"] == g - 1]
                                          == 0.0).all()
    assert 0 < acc.mean() < g


def test_trace_matrix_rows_are_what_the_decoder_hands_a_rule_on_the_same_path():
    pair = tracekit.pair()
    g, blocks = pair.config.block_size, 3
    pr = _prompts(pair, n=16, start=1)
    n = len(pr)
    cols, plain = DEC.decode(pair, pr, [np.random.default_rng(50 + i) for i in range(n)],
                             blocks)
    ts = T.TraceSplit(cols, {"block_size": g, "top_k": pair.config.top_k,
                             "context_len": pair.config.context_len, "vocab_size": DEC.VOCAB,
                             "format_version": 3}, "recorded")
    F = spec.TraceArrays.from_split(ts).features()
    spy = Spy(tree_rule(STANDARD_TREE))         # the standard rule's decisions, reading both
    _, acc = DEC.decode(pair, pr, [np.random.default_rng(50 + i) for i in range(n)], blocks,
                        rule=spy, record=False)
    assert np.array_equal(acc, plain)              # the same path
    seen = _seen(spy, n, blocks, g)
    for f in ("next_tv", "ahead"):
        assert (F[f] == F[f][:, :1]).all()         # one value per drafted position
        np.testing.assert_array_equal(F[f][:, 0], seen[f], err_msg=f)
    assert seen["ahead"].max() > 0.5


def test_emission_holds_the_paths_lookahead_for_every_token_of_a_slot():
    rng = np.random.default_rng(3)
    M, V = 5, 9
    p = rng.dirichlet(np.full(V, 0.5), size=M)
    q = rng.dirichlet(np.full(V, 0.5), size=M)
    z = np.zeros(M, np.int64)
    look = {"next_tv": rng.random(M), "ahead": 3 * rng.random(M)}
    rule = tree_rule(AHEAD_TREE)
    tv, kl = EM.slot_distortion(p, q, z, z, rule, V, look)
    F = EM.vocab_features(p, q, z, z, look)
    assert F["ahead"].shape == (M, V) and (F["ahead"] == look["ahead"][:, None]).all()
    for m in range(M):                # the same rule with slot m's values as constants
        const = AHEAD_TREE.replace("ahead", repr(float(look["ahead"][m]))).replace(
            "next_tv", repr(float(look["next_tv"][m])))
        t1, k1 = EM.slot_distortion(p[m:m + 1], q[m:m + 1], z[:1], z[:1], tree_rule(const), V)
        assert tv[m] == pytest.approx(t1[0], rel=1e-12, abs=1e-15)
        assert kl[m] == pytest.approx(k1[0], rel=1e-12, abs=1e-15)
    assert tv.max() > 1e-3
    # no lookahead where the rule reads it: refused, naming the parameter
    for r in (rule, as_rule(lambda draft_prob, target_prob, position, draft_entropy,
                            target_entropy, top_token_match, block_position, p_max, q_max,
                            ahead: 1.0)):
        with pytest.raises(EvolveError, match=r"^lookahead: None \(not given\), but the "
                                              r"rule .* reads next_tv/ahead"):
            EM.slot_distortion(p, q, z, z, r, V)
    with pytest.raises(EvolveError, match=r"^lookahead: 'ahead' is of shape \(4,\)"):
        EM.vocab_features(p, q, z, z, {"next_tv": look["next_tv"], "ahead": np.zeros(4)})
    # rules that do not read them need none
    plain, _ = EM.slot_distortion(p, q, z, z, named_rule("leniency", 0.5)[0], V)
    assert np.array_equal(plain, EM.slot_distortion(p, q, z, z, named_rule("leniency", 0.5)[0],
                                                    V, look)[0])


def test_paired_comparison_of_a_rule_that_reads_the_lookahead():
    pair = tracekit.pair()
    rules = {"standard": named_rule("standard_rejection")[0],
             "ahead": tree_rule(AHEAD_TREE, "ahead")}
    small = {"lookahead_slots": 30, "lookahead_futures": 4}
    res = paired.compare(pair, rules, "test", 24, 4, seed=5, **small)
    assert res == paired.compare(pair, rules, "test", 24, 4, seed=5, **small)
    a = res["rules"]["ahead"]
    for key in ("tokens_per_call", "tv_per_token", "kl_per_token", "slot_tv_p99",
                "target_loglik_per_token", "draft_loglik_per_token"):
        assert np.isfinite(a[key]), key
    assert a["tv_per_token"] > 1e-4                  # the rule is not the standard one
    d = a["distortion"]
    assert d["kind"] == "estimate" and d["slots"] == 30 and d["reached"] > 30
    assert res["rules"]["standard"]["distortion"] == {"kind": "exact"}
    # the tracked slot TV is the estimated emission (every candidate, its own later
    # drafts, the tilt of reaching the slot) at the sampled reached slots, not the
    # emission with the path's later slots for every candidate
    raw = paired.run_rule(pair, rules["ahead"], "test", 8, 2, 5, 12, 4)
    pr, rngs = NG.prompt_starts(ngram_free.seeded_pair(pair, 5), "test", 8)
    cols, acc = DEC.decode(pair, pr, rngs, 2, rule=rules["ahead"], record=True)
    g = pair.config.block_size
    reached = np.flatnonzero(cols["block_position"] <= np.repeat(acc.reshape(-1), g))
    rng = np.random.default_rng((5, 11))
    rows = reached[np.sort(rng.choice(reached.size, size=12, replace=False))]
    want, _, _ = LE.estimate_slots(pair, rules["ahead"], cols, rows, 4, 5)
    np.testing.assert_array_equal(raw["slot_tv"], want)
    look = DEC.lookahead_features(cols["slot_tv"], g)
    ctx = cols["context"][rows]
    path, _ = EM.slot_distortion(pair.target.probs(ctx), pair.draft.probs(ctx),
                                 cols["position"][rows], cols["block_position"][rows],
                                 rules["ahead"], pair.config.top_k,
                                 {f: v[rows] for f, v in look.items()})
    early = cols["block_position"][rows] < g - 1      # the last slot is the same either way
    assert np.abs(path - want)[early].max() > 1e-4


@pytest.fixture(scope="module")
def hf_free_pair(tmp_path_factory):
    """A tiny Hugging Face pair (random-init GPT-2s) with its prompt corpus, loaded as
    a comparison loads it."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from evolve.data.sources import hf
    from evolve.data.sources.hf import free as hf_free, prompts as hf_prompts
    from tests import hfkit
    tmp = tmp_path_factory.mktemp("hf-lookahead")
    target, draft = hfkit.tiny_pair(tmp)
    corpus = hfkit.write_corpus(tmp / "corpus", 6, "row {j} of file {i}: def g(x): return x\n")
    cfg = hf.HFTraceConfig(target=str(target), draft=str(draft), block_size=3, top_k=8,
                           blocks_per_prompt=3, prompt_len=16, train_prompts=8, valid_prompts=8,
                           test_prompts=8, corpus_dir=str(corpus), batch_size=8)
    return hf_free.FreePair(hf.load_pair(cfg), None, hf_prompts.load_corpus(cfg))


def _hf_decoded(fp, rule, seed=2):
    from evolve.data.sources.hf import decode as hf_decode, prompts as hf_prompts
    ids, rngs = hf_prompts.split_prompts(fp.pair, "test", None, fp.corpus, n=8, draw=seed)
    _, accepted, tracked = hf_decode.decode(fp.pair, ids, rngs, 3, record=False, rule=rule,
                                            track=True)
    return np.array([len(i) for i in ids]), accepted, tracked


@pytest.mark.slow
def test_hf_estimate_of_a_rule_without_lookahead_is_the_tracked_exact_distortion(hf_free_pair):
    # each sampled slot's history is rebuilt from the decoded text (the prompt, the
    # blocks before, the accepted drafts), the models read it again, and the estimator
    # of the n-gram pair runs on their distributions: for a rule that reads no
    # lookahead input that is the exact emission the decoder tracked at that slot
    from evolve.data.sources.hf import lookahead as HL
    rule = named_rule("leniency", 0.5)[0]
    lens, accepted, tracked = _hf_decoded(hf_free_pair, rule)
    rows, tv, kl, tv_half, bound = HL.estimate(hf_free_pair, rule, lens, accepted, tracked,
                                               2, 12, 4)
    assert rows.size == 12 and len(set(tracked["block_position"][rows])) >= 2
    np.testing.assert_allclose(tv, tracked["tv"][rows], rtol=0, atol=1e-6)
    np.testing.assert_allclose(kl, tracked["kl"][rows], rtol=0, atol=1e-6)
    np.testing.assert_allclose(tv_half, tv, rtol=0, atol=1e-12)     # no futures read
    assert tv.max() > 1e-3                                         # a lossy rule


@pytest.mark.slow
def test_hf_estimate_reads_the_same_distributions_with_and_without_the_repeated_cache(
        hf_free_pair):
    from evolve.data.sources.hf import lookahead as HL
    rule = tree_rule(AHEAD_TREE, "ahead")
    lens, accepted, tracked = _hf_decoded(hf_free_pair, rule)
    cached = HL.estimate(hf_free_pair, rule, lens, accepted, tracked, 2, 5, 4, candidates=64)
    whole = HL.estimate(hf_free_pair, rule, lens, accepted, tracked, 2, 5, 4,
                        repeat_cache=False, candidates=64)
    assert np.array_equal(cached[0], whole[0])
    for a, b in zip([*cached[1:4], cached[4]["tv_quarter"], cached[4]["bound"]],
                    [*whole[1:4], whole[4]["tv_quarter"], whole[4]["bound"]]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-8)
    # a rule that reads the lookahead: the path's later slots are not every candidate's
    assert np.abs(cached[1] - tracked["tv"][cached[0]]).max() > 1e-5
    # 64 of 256 candidates: a worst case where the slot has later slots, none at the
    # block's last slot, and the TV with 16; every candidate (the default for 256): no cut
    cut = cached[4]
    assert cut["candidates"] == 64 and cut["quarter"] == 16
    last = tracked["block_position"][cached[0]] == 2
    assert (cut["bound"][~last] > 0).all() and (cut["bound"][last] == 0).all()
    assert (~last).any() and (cut["bound"] <= 1).all()
    np.testing.assert_allclose(cut["tv_quarter"][last], cached[1][last], rtol=0, atol=1e-12)
    every = HL.estimate(hf_free_pair, rule, lens, accepted, tracked, 2, 5, 4)
    assert every[4] is None and np.array_equal(every[0], cached[0])
    assert HL.candidates_of(256) is None and HL.candidates_of(49152) == HL.CANDIDATES == 16


@pytest.mark.slow
def test_hf_pair_free_running_with_a_lookahead_rule(hf_free_pair, monkeypatch):
    from evolve.data.sources.hf import decode as hf_decode, prompts as hf_prompts
    fp = hf_free_pair
    ids, rngs = hf_prompts.split_prompts(fp.pair, "test", None, fp.corpus)
    cols, _ = hf_decode.decode(fp.pair, ids, rngs, 3)
    assert not {"next_tv", "ahead"} & set(cols)        # traces derive them, never record them
    spy = Spy(tree_rule(AHEAD_TREE))
    ids, rngs = hf_prompts.split_prompts(fp.pair, "test", None, fp.corpus)
    hf_decode.decode(fp.pair, ids, rngs, 3, record=False, rule=spy)
    first = spy.seen[0]                                # block 0 starts on the recorded path
    rows = np.arange(len(ids))[:, None] * 9 + np.arange(3)[None, :]     # g 3, 3 blocks
    want = DEC.lookahead_features(cols["slot_tv"][rows.reshape(-1)], 3)
    for f in want:
        np.testing.assert_allclose(first[f], want[f], rtol=0, atol=1e-14, err_msg=f)
    rules = {"standard": named_rule("standard_rejection")[0],
             "ahead": tree_rule(AHEAD_TREE, "ahead")}
    small = {"lookahead_slots": 6, "lookahead_futures": 4}
    res = paired.compare(fp, rules, "test", 8, 3, seed=2, **small)
    assert res == paired.compare(fp, rules, "test", 8, 3, seed=2, **small)
    a = res["rules"]["ahead"]
    # the distortion of a lookahead rule is estimated at a sample of the reached slots,
    # labelled so, never the path's values as if exact
    d = a["distortion"]
    assert d["kind"] == "estimate" and d["slots"] == 6 and d["futures"] == 4
    assert d["reached"] > 6
    assert "candidates" not in d                       # 256 tokens: every candidate
    for key in ("tokens_per_call", "tv_per_token", "kl_per_token", "slot_tv_p99"):
        assert np.isfinite(a[key]), key
    assert np.isfinite(res["versus_reference"]["ahead"]["tv_per_token"]["difference"])
    assert res["rules"]["standard"]["distortion"] == {"kind": "exact"}
    # a vocabulary above EVERY_UP_TO: later drafts after the draft's most likely
    # candidates, the note saying how many and their bound
    from evolve.data.sources.hf import lookahead as HL
    monkeypatch.setattr(HL, "EVERY_UP_TO", 100)
    monkeypatch.setattr(HL, "CANDIDATES", 16)
    d = paired.compare(fp, rules, "test", 8, 3, seed=2, **small)["rules"]["ahead"]["distortion"]
    assert d["candidates"] == 16 and d["quarter"] == 4 and 0 < d["candidate_bound_mean"] <= 1
    assert abs(d["slot_tv_mean_quarter_candidates"] - d["slot_tv_mean"]) < 0.05


def test_simulation_at_trace_contexts_holds_the_recorded_lookahead(monkeypatch):
    from evolve.freerun import simulate as S
    pair, ts = tracekit.pair(), tracekit.split("test")
    rule = tree_rule(AHEAD_TREE, "ahead")
    rows = S.trace_rows(ts, 30, seed=2)
    look = EM.trace_lookahead(ts, rows)
    sa = spec.TraceArrays.from_split(ts)
    F = sa.features()
    for f in ("next_tv", "ahead"):                 # what the offline objectives hold
        np.testing.assert_array_equal(look[f], F[f][rows, 0], err_msg=f)
    # the exact emission at those contexts is the offline exact TV of those rows
    cols = {f: ts.columns[f][rows] for f in ("context", "position", "block_position")}
    p, q, Fv = S.rows_features(pair, cols["context"], cols["position"], cols["block_position"],
                              look)
    tv, _ = EM.distortion(p, S.exact_output(p, q, S.acceptance_matrix(pair, p, q, Fv, rule)))
    offline = spec.position_terms(sa, S.offline_thresholds(rule, sa)).tv[rows]
    np.testing.assert_allclose(tv, offline, rtol=1e-9, atol=1e-12)
    seen = []
    real = EM.vocab_features
    monkeypatch.setattr(EM, "vocab_features", lambda *a: seen.append(a[4]) or real(*a))
    res = S.check_rule(pair, ts, rule, prompts=8, blocks=2, contexts=30, reps=300, seed=2)
    assert len(seen) == 2 and all(set(s) == set(look) for s in seen)
    for s in seen:                                   # the witness set's and the sample's
        for f in look:
            np.testing.assert_array_equal(s[f], look[f], err_msg=f)
    assert res == S.check_rule(pair, ts, rule, prompts=8, blocks=2, contexts=30, reps=300,
                               seed=2)
    agree = res["agreement"]
    assert np.isfinite(agree["tv_at_contexts"]["difference"]) and \
        abs(agree["tv_at_contexts"]["z"]) < S.Z_AGREE
    assert res["offline"]["tv_at_contexts"] > 1e-4
