"""The engines' own lossy knobs as rule families: each family's exact emitted
distribution (``evolve.data.emission``, ``evolve.objectives.spec``) against a Monte
Carlo simulation of the engine's algorithm written here from the engine's source
(docs/export.md), the free-running decoder's residual, tuning and the trade-off rows."""

import dataclasses
import json
import types

import numpy as np
import pytest

from evolve.data import decode as DEC
from evolve.data import emission as EM
from evolve.data.sources import ngram as NG
from evolve.objectives import spec
from evolve.rules import tuning
from evolve.rules.adapters import RuleError, named_rule
from evolve.rules.table import RULES, engine_families, families
from tests import tracekit
from tests.clikit import invoke, one_line_error

V = 8
DRAWS = 200_000
Z_TOL = 5.0          # the Monte Carlo histogram is within 5 standard errors per token


def _pq(seed: int, m: int = 3, V: int = V):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, 0.7), size=m)
    q = rng.dirichlet(np.full(V, 0.7), size=m)
    p[0] = 0.5 * p[0] + 0.5 * q[0]           # one slot where the pair agrees more
    return p, q


# ----------------------------------------------- the engines, as their sources read

def transformers_step(p, q, w, rng, n):
    """transformers `_speculative_sampling` with assistant_ensemble_weight w, one slot:
    x ~ q; keep iff u <= 1 - w + w p(x)/q(x); else draw from norm(max(0, p - q)) (p
    where that is zero)."""
    x = rng.choice(p.size, size=n, p=q)
    keep = rng.random(n) <= 1.0 - w + w * p[x] / q[x]
    r = np.maximum(p - q, 0.0)
    r = p if r.sum() <= 0 else r
    y = rng.choice(p.size, size=n, p=r / r.sum())
    return np.where(keep, x, y)


def sglang_step(p, q, t_single, t_acc, rng, n):
    """SGLang `TreeSpeculativeSamplingTargetOnly`, chain drafting (one sibling), one
    slot: x ~ q; keep iff coin <= p(x) / t_acc or p(x) >= t_single; else sample from
    relu(p - buffer), the buffer holding p(x) at x (p with x removed)."""
    x = rng.choice(p.size, size=n, p=q)
    coin = rng.random(n)
    keep = (coin <= p[x] / t_acc) | (p[x] >= t_single)
    y = np.empty(n, dtype=np.int64)
    for v in range(p.size):            # the rejected draft's residual, per drafted token
        m = x == v
        r = p.copy()
        r[v] = 0.0
        y[m] = rng.choice(p.size, size=int(m.sum()), p=r / r.sum())
    return np.where(keep, x, y)


def engine_step(name, value, p, q, rng, n):
    if name == "hf_ensemble":
        return transformers_step(p, q, value, rng, n)
    if name == "sglang_acc":
        return sglang_step(p, q, 1.0, value, rng, n)
    assert name == "sglang_single"
    return sglang_step(p, q, value, 1.0, rng, n)


CASES = [("hf_ensemble", 1.0), ("hf_ensemble", 0.7), ("hf_ensemble", 0.2),
         ("hf_ensemble", 0.0), ("sglang_acc", 1.0), ("sglang_acc", 0.6), ("sglang_acc", 0.15),
         ("sglang_single", 1.0), ("sglang_single", 0.5), ("sglang_single", 0.2)]


def _exact(name, value, p, q, k=V):
    rule, _ = named_rule(name, value)
    m = p.shape[0]
    F = EM.vocab_features(p, q, np.zeros(m, np.int64), np.zeros(m, np.int64))
    return EM.exact_output(p, q, EM.acceptance(p, q, F, rule, k), DEC.residual_kind(rule))


@pytest.mark.parametrize("name,value", CASES)
def test_emitted_distribution_matches_the_engine(name, value):
    p, q = _pq(11)
    out = _exact(name, value, p, q, k=3)     # the engines judge the draft's tail too
    assert np.allclose(out.sum(axis=1), 1.0)
    rng = np.random.default_rng(5)
    for m in range(p.shape[0]):
        f = np.bincount(engine_step(name, value, p[m], q[m], rng, DRAWS), minlength=V) / DRAWS
        se = np.sqrt(np.maximum(out[m] * (1 - out[m]), 1e-12) / DRAWS)
        assert (np.abs(f - out[m]) <= Z_TOL * se + 1e-9).all(), (name, value, m, f, out[m])


def test_the_monte_carlo_tells_the_residuals_apart():
    """The check has power: SGLang's engine against the standard residual's exact
    distribution (the one the table would use without its residual) is far off."""
    p, q = _pq(11)
    rule, _ = named_rule("sglang_acc", 0.6)
    F = EM.vocab_features(p, q, np.zeros(3, np.int64), np.zeros(3, np.int64))
    wrong = EM.exact_output(p, q, EM.acceptance(p, q, F, rule, V))      # standard residual
    f = np.bincount(engine_step("sglang_acc", 0.6, p[1], q[1], np.random.default_rng(5),
                                DRAWS), minlength=V) / DRAWS
    se = np.sqrt(np.maximum(wrong[1] * (1 - wrong[1]), 1e-12) / DRAWS)
    assert (np.abs(f - wrong[1]) > Z_TOL * se).any()


def test_sglang_defaults_and_ensemble_one_keep_the_target():
    p, q = _pq(2)
    for name in ("hf_ensemble", "sglang_acc", "sglang_single"):
        assert np.allclose(_exact(name, 1.0, p, q), p, atol=1e-12), name


def test_hf_ensemble_is_lenient_and_monotone_along_its_grid():
    r = RULES["hf_ensemble"]
    assert r.lenient and r.grid[0] == 1.0 and r.grid[-1] == 0.0
    assert list(r.grid) == sorted(r.grid, reverse=True)
    ratio = np.linspace(0.0, 5.0, 501)
    prev = np.minimum(1.0, ratio)
    for w in r.grid:
        a = np.minimum(1.0, 1.0 - w + w * ratio)
        assert (a >= np.minimum(1.0, ratio) - 1e-15).all() and (a >= prev - 1e-15).all()
        prev = a


# ------------------------------------------ the exact objectives on k = V traces

def _spec_arrays(p, q, drafts, k=None):
    """A TraceArrays of g = 1 blocks, one per row, with the draft's top-k candidates
    (every token without ``k``) and the tail masses, as a trace stores them."""
    n, Vv = p.shape
    k = Vv if k is None else k
    cs = DEC.candidate_summary(p, q, k, token_dtype=np.int64)
    order = cs["cand_token"]
    look = DEC.lookahead_features(DEC.slot_features(p, q)["slot_tv"], 1)   # g = 1 blocks
    F = EM.vocab_features(p, q, np.zeros(n, np.int64), np.zeros(n, np.int64), look,
                          classes=np.arange(Vv) % 4)
    X = np.stack([np.take_along_axis(np.asarray(F[f], dtype=np.float64), order, axis=1)
                  for f in spec.FEATURES]).reshape(len(spec.FEATURES), n * k)
    hit = order == drafts[:, None]
    dcand = np.where(hit.any(axis=1), np.argmax(hit, axis=1), -1)
    rows = np.arange(n)
    return spec.TraceArrays(1, k, n, np.ascontiguousarray(X),
                           cs["cand_draft_prob"].reshape(-1), cs["cand_target_prob"].reshape(-1),
                           *(cs[f] for f in ("tail_draft_prob", "tail_target_prob",
                                             "tail_excess_draft_prob",
                                             "tail_excess_target_prob")),
                           dcand.astype(np.int64),
                           np.minimum(1.0, p[rows, drafts] / q[rows, drafts])), order


@pytest.mark.parametrize("w", [1.0, 0.8, 0.3, 0.0])
def test_ensemble_tail_drafts_are_scored_as_transformers_judges_them(w):
    """With top-k < vocabulary the tail's drafts are judged by the ensemble rule too
    (transformers judges every draft): acceptance, TV and the drafted token's
    acceptance from the stored tail masses equal the full-vocabulary exact values."""
    p, q = _pq(3, m=5)
    drafts = np.argsort(q, axis=1)[:, 0]                      # the least likely: a tail draft
    sa, _ = _spec_arrays(p, q, drafts, k=3)
    assert (sa.dcand < 0).all() and sa.tq.min() > 0
    terms = spec.position_terms(sa, tuning.thresholds("hf_ensemble", sa, w),
                                **tuning.scoring("hf_ensemble", w))
    full = _exact("hf_ensemble", w, p, q)
    assert np.allclose(terms.tv, EM.distortion(p, full)[0], atol=1e-12)
    a = np.minimum(1.0, 1.0 - w + w * p / q)
    assert np.allclose(terms.alpha, (q * a).sum(axis=1), atol=1e-12)
    assert np.allclose(terms.a_x, a[np.arange(5), drafts], atol=1e-12)
    if w < 1.0:    # the standard tail (the top-k restricted rule) would be another number
        std = spec.position_terms(sa, tuning.thresholds("hf_ensemble", sa, w))
        assert not np.allclose(std.alpha, terms.alpha)


@pytest.mark.parametrize("name,value", CASES)
def test_offline_objectives_use_the_family_residual(name, value):
    p, q = _pq(7, m=4)
    sa, order = _spec_arrays(p, q, np.zeros(4, np.int64))
    terms = spec.position_terms(sa, tuning.thresholds(name, sa, value), RULES[name].residual)
    want = np.take_along_axis(_exact(name, value, p, q), order, axis=1)
    assert np.allclose(terms.out, want, atol=1e-12)
    assert np.allclose(terms.tv, EM.distortion(p, _exact(name, value, p, q))[0], atol=1e-12)
    # acceptance: the engine's kept-draft frequency
    rng = np.random.default_rng(1)
    a = tuning.thresholds(name, sa, value).reshape(4, V)
    for m in range(4):
        x = rng.choice(V, size=DRAWS, p=q[m])
        xi = np.argmax(order[m][None, :] == x[:, None], axis=1)
        kept = rng.random(DRAWS) < np.clip(a[m, xi], 0, 1)
        se = np.sqrt(terms.alpha[m] * (1 - terms.alpha[m]) / DRAWS) + 1e-12
        assert abs(kept.mean() - terms.alpha[m]) <= Z_TOL * se


def test_target_only_family_refuses_a_split_with_a_draft_tail():
    ts = tracekit.split("valid")
    sa = spec.TraceArrays.from_split(ts)
    assert sa.k < 256 and sa.tq.max() > 0
    with pytest.raises(spec.TailError, match="top-k"):
        tuning.evaluate("sglang_acc", sa, 0.5)
    assert tuning.scorable("sglang_acc", sa) is not None
    assert tuning.scorable("hf_ensemble", sa) is None
    assert {p.rule for p in tuning.sweep_all(sa)} == set(families()) - {"sglang_acc",
                                                                          "sglang_single"}


FULL = dataclasses.replace(tracekit.TINY, top_k=256)


@pytest.fixture(scope="module")
def full_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("full_vocab_traces")
    NG.build_splits(FULL, d)
    return d


tiny_dir = tracekit.tiny_dir_fixture()


def test_tuned_sglang_setting_is_within_budget_and_pasteable(full_dir):
    r = invoke("tradeoff", "--data", full_dir, "--budget", 0.03, "--engine", "sglang", "--json")
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["budgets"][0]["rows"]
    # only the engine's knobs were swept, with standard rejection and the oracle beside
    assert {x["rule"] for x in rows} == set(engine_families("sglang")) | {
        "standard_rejection", "knapsack_oracle"}
    rows = [x for x in rows if x.get("engine") == "sglang"]
    for x in rows:
        assert x["fits_valid"] and x["valid"]["tv_per_token"] <= 0.03
        assert x["setting"].startswith("--speculative-accept-threshold-single ")
        assert f"{x['param']:.4g}" in x["setting"]
        assert "--speculative-eagle-topk 1" in x["setting"]      # chain drafts, as scored
    acc = next(x for x in rows if x["rule"] == "sglang_acc")
    assert acc["test"]["tokens_per_call"] > 1.0


def test_tradeoff_table_shows_engine_settings(tiny_dir):
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert "engine settings" in out and "transformers: assistant_ensemble_weight=" in out
    assert "sglang: sglang_acc: not scored" in out                 # SGLang at top-k 16
    assert "needs top-k = vocabulary" in out
    one = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, "--engine", "transformers",
                 "--json")
    doc = json.loads(one.stdout)
    rows = doc["budgets"][0]["rows"]
    assert sorted(x["rule"] for x in rows) == ["hf_ensemble", "knapsack_oracle",
                                               "standard_rejection"]
    assert set(doc["series"]) == {"hf_ensemble", "standard_rejection"}   # nothing else swept
    rows = [x for x in rows if x["rule"] == "hf_ensemble"]
    # the weight, and the settings that decode as it was scored: the traces' draft
    # length (a constant one, no confidence cut-off) and temperature, no truncation
    g = tracekit.TINY.block_size
    setting = rows[0]["setting"]
    assert setting.startswith(f"assistant_ensemble_weight={rows[0]['param']:.4g}, "
                              "do_sample=True, temperature=1, top_k=0, top_p=1.0")
    assert (f"num_assistant_tokens={g}, num_assistant_tokens_schedule='constant', "
            "assistant_confidence_threshold=0.0") in setting
    # the own-trajectory estimate assumes the top-k rule: not given for an engine's knob
    traj = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, "--engine", "transformers",
                  "--trajectory", "--json")
    knob = next(x for x in json.loads(traj.stdout)["budgets"][0]["rows"]
                if x["rule"] == "hf_ensemble")
    assert "trajectory" not in knob["test"]


def test_tradeoff_bad_engine_is_one_line(tiny_dir):
    one_line_error(invoke("tradeoff", "--data", tiny_dir, "--engine", "vllm"), "--engine",
                   "vllm", "transformers")


@pytest.mark.parametrize("name,bad,needle", [("hf_ensemble", 1.5, "0 <= w <= 1"),
                                             ("sglang_acc", 0.0, "0 < t_acc <= 1"),
                                             ("sglang_acc", 1.5, "0 < t_acc <= 1"),
                                             ("sglang_single", -0.1, "0 <= t_single <= 1")])
def test_engine_parameters_out_of_range_are_refused(name, bad, needle):
    with pytest.raises(RuleError, match=needle):
        named_rule(name, bad)


# ----------------------------------------------------- the free-running decoder

class _Fixed:
    def __init__(self, dist):
        self.dist = dist

    def probs(self, H):
        return np.broadcast_to(self.dist, (H.shape[0], self.dist.size)).copy()


class _FixedPair:
    """Fixed target and draft over the 256 bytes, one-token blocks."""

    def __init__(self, p, q, top_k):
        self.target, self.draft = _Fixed(p), _Fixed(q)
        self.config = types.SimpleNamespace(block_size=1, top_k=top_k, context_len=1)


@pytest.mark.parametrize("name,value,top_k", [("sglang_acc", 0.3, 4), ("sglang_single", 0.2, 4),
                                              ("hf_ensemble", 0.5, 4)])
def test_free_running_decoder_emits_the_exact_distribution(name, value, top_k):
    """The n-gram decoder with the family: the first emitted byte's histogram over many
    prompts against the exact distribution (SGLang: every draft judged by the rule, p
    without the draft after a rejection)."""
    p = np.zeros(256)
    q = np.zeros(256)
    # top-4 of q: bytes 0..3; byte 4 (p < q) is a tail draft the engine judges too
    q[:6] = [0.3, 0.25, 0.2, 0.1, 0.1, 0.05]
    p[:6] = [0.05, 0.1, 0.15, 0.3, 0.02, 0.38]
    n = 40_000
    pair = _FixedPair(p, q, top_k)
    rule, _ = named_rule(name, value)
    rngs = [np.random.default_rng(s) for s in range(n)]
    _, _, hist, _ = DEC.decode(pair, np.zeros((n, 1), np.uint8), rngs, 1, batch=8192,
                               rule=rule, record=False, history=True)
    f = np.bincount(hist[:, 1], minlength=256)[:6] / n
    P, Q = p[None, :6], q[None, :6]
    want = _exact(name, value, P, Q, k=top_k)[0]
    se = np.sqrt(np.maximum(want * (1 - want), 1e-12) / n)
    assert (np.abs(f - want) <= Z_TOL * se).all(), (f, want)


def test_free_running_sglang_defaults_keep_the_target_and_compare_accepts_engines(tiny_dir):
    """`evolve simulate --compare` takes the engine families; at SGLang's defaults
    (lossless with its own residual) every slot's TV is 0 along the trajectory, while
    a lower t_acc buys tokens and pays distortion."""
    r = invoke("simulate", "--compare", "standard_rejection", "--compare", "sglang_acc:1",
               "--compare", "sglang_acc:0.3", "--compare", "hf_ensemble:0.5",
               "--data", tiny_dir, "--prompts", 16, "--blocks", 3, "--json")
    assert r.exit_code == 0, r.output
    rules = json.loads(r.stdout)["rules"]
    assert rules["sglang_acc(t_acc=1)"]["tv_per_token"] < 1e-12
    assert rules["sglang_acc(t_acc=1)"]["slot_tv_p99"] < 1e-12
    assert rules["sglang_acc(t_acc=0.3)"]["tv_per_token"] > 1e-3
    assert rules["hf_ensemble(w=0.5)"]["tv_per_token"] > 1e-3


def test_simulate_heuristic_refuses_a_target_only_family(tiny_dir):
    one_line_error(invoke("simulate", "--heuristic", "sglang_acc", "--data", tiny_dir),
                   "--rule", "sglang_acc", "--compare")


def test_hf_decoder_draws_after_a_rejection_from_p_without_the_draft(tmp_path, monkeypatch):
    """The Hugging Face decoder with an SGLang family: every draw after a rejection
    comes from p with the rejected draft removed (never the rejected draft), and the
    engine's rule judged every draft."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from evolve.data.sources import hf
    from evolve.data.sources.hf import decode as hf_decode, prompts as hf_prompts
    from tests import hfkit
    target, draft = hfkit.tiny_pair(tmp_path)
    corpus = hfkit.write_corpus(tmp_path / "corpus", 6, "line {j} of {i}: return x + {j}\n")
    cfg = hf.HFTraceConfig(target=str(target), draft=str(draft), block_size=3, top_k=4,
                           blocks_per_prompt=3, prompt_len=12, train_prompts=8,
                           valid_prompts=8, test_prompts=8, corpus_dir=str(corpus),
                           batch_size=8)
    pair = hf.load_pair(cfg)
    ids, rngs = hf_prompts.split_prompts(pair, "test", None, hf_prompts.load_corpus(cfg))
    seen = []
    real = hf_decode.rejection_residual

    def spy(kind, p, q, x):
        r = real(kind, p, q, x)
        seen.append((kind, r[np.arange(len(x)), x], p[np.arange(len(x)), x]))
        return r

    monkeypatch.setattr(hf_decode, "rejection_residual", spy)
    rule = named_rule("sglang_single", 1.0)[0]       # keep with p(x): rejections are common
    _, acc = hf_decode.decode(pair, ids, rngs, 3, record=False, rule=rule)
    assert seen and all(kind == "target_without_draft" for kind, _, _ in seen)
    rows = np.concatenate([r for _, r, _ in seen])
    px = np.concatenate([p for _, _, p in seen])
    assert (rows[px < 1.0 - 1e-9] == 0.0).all()      # the rejected draft has no mass
    assert acc.mean() < 3
