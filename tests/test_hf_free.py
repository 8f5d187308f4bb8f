"""Free-running paired comparisons with a Hugging Face pair (evolve.data.sources.hf.free,
evolve.freerun.paired, evolve simulate --compare) on the tiny random-init GPT-2 pair of
tests/hfkit.py: the rule-aware decoder against the recorder, the tracked distortion
against the offline exact slot TV, the log-likelihoods against a direct forward
pass, pairing, determinism and the refusals."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from evolve.freerun import paired  # noqa: E402
from evolve.data import traces as T  # noqa: E402
from evolve.data.sources import hf# noqa: E402
from evolve.data.sources.hf import decode as hf_decode, free as hf_free, prompts as hf_prompts  # noqa: E402
from evolve.objectives import spec  # noqa: E402
from evolve.rules.adapters import named_rule  # noqa: E402
from evolve.freerun.simulate import offline_thresholds  # noqa: E402
from tests import clikit, hfkit  # noqa: E402
from tests.clikit import one_line_error  # noqa: E402

G, K, PROMPTS, BLOCKS = 3, 8, 12, 3
ENV = {"HF_HUB_OFFLINE": "1"}
DEV = hfkit.test_device()      # torch's CPU, or the GPU with EVOLVE_TEST_ON_GPU=1


@pytest.fixture(scope="module")
def free(tmp_path_factory):
    """A FreePair over a small corpus directory (prompt pools as the traces have them)."""
    root = tmp_path_factory.mktemp("hf_free")
    target, draft = hfkit.tiny_pair(root)
    corpus = hfkit.write_corpus(root / "corpus", 8, "row {j} of file {i}: def g(x): return x\n")
    cfg = hf.HFTraceConfig(target=str(target), draft=str(draft), block_size=G, top_k=K,
                           blocks_per_prompt=BLOCKS, prompt_len=20, train_prompts=PROMPTS,
                           valid_prompts=PROMPTS, test_prompts=PROMPTS, corpus_dir=str(corpus),
                           batch_size=PROMPTS, device=DEV)
    pair = hf.load_pair(cfg)
    return hf_free.FreePair(pair, None, hf_prompts.load_corpus(cfg))


def _prompts(fp, draw=None):
    return hf_prompts.split_prompts(fp.pair, "test", None, fp.corpus, draw=draw)


def test_the_standard_rule_as_a_rule_decodes_as_the_recorder_with_no_distortion(free):
    ids, rngs = _prompts(free)
    _, plain = hf_decode.decode(free.pair, ids, rngs, BLOCKS, record=False)
    ids, rngs = _prompts(free)
    std = named_rule("standard_rejection")[0]
    _, acc, tr = hf_decode.decode(free.pair, ids, rngs, BLOCKS, record=False, rule=std,
                                  track=True)
    assert np.array_equal(acc, plain)
    assert 0 < plain.mean() < G                      # the pair neither always agrees nor never
    assert tr["tv"].size == (np.minimum(acc + 1, G)).sum()     # every reached position
    assert np.abs(tr["tv"]).max() < 1e-12 and np.abs(tr["kl"]).max() < 1e-12


def test_tracked_distortion_is_the_offline_exact_slot_tv(free):
    """First blocks start from the recorded prompts with the recorded uniforms, so each
    reached position's tracked TV is the exact offline TV of that trace row."""
    ids, rngs = _prompts(free)
    cols, _ = hf_decode.decode(free.pair, ids, rngs, BLOCKS)
    ts = T.TraceSplit(cols, hf.meta(free.pair, "test", len(cols["draft_prob"]), {}),
                      name="test")
    sa = spec.TraceArrays.from_split(ts)
    rule = named_rule("leniency", 0.5)[0]
    offline = spec.position_terms(sa, offline_thresholds(rule, sa)).tv
    ids, rngs = _prompts(free)
    _, acc, tr = hf_decode.decode(free.pair, ids, rngs, BLOCKS, record=False, rule=rule,
                                  track=True)
    first = tr["sequence"] * BLOCKS * G + tr["block_position"]     # block 0's trace rows
    block0 = tr["block"] == 0
    assert block0.sum() == np.minimum(acc[:, 0] + 1, G).sum()
    assert np.allclose(tr["tv"][block0], offline[first[block0]], rtol=1e-9, atol=1e-12)
    assert tr["tv"][block0].max() > 0.01          # the lenient rule distorts


def test_log_likelihoods_are_the_models_own(free):
    ids, rngs = _prompts(free, draw=3)
    rule = named_rule("leniency", 0.7)[0]
    _, _, tr = hf_decode.decode(free.pair, ids, rngs, BLOCKS, record=False, rule=rule,
                                track=True)
    starts = np.array([len(i) for i in ids])
    lp, lq, emitted = hf_free.loglik(free.pair, tr["history"], starts)
    for s in (0, PROMPTS - 1):
        h = torch.tensor(tr["history"][s], device=DEV)[None]
        for model, got in ((free.pair.target, lp[s]), (free.pair.draft, lq[s])):
            with torch.no_grad():
                logp = torch.log_softmax(model(h).logits[0].double(), -1).cpu().numpy()
            t = np.arange(starts[s], h.shape[1])
            assert got == pytest.approx(logp[t - 1, tr["history"][s][t]].sum(), rel=1e-5)
        assert emitted[s] == h.shape[1] - starts[s] >= BLOCKS


def test_paired_comparison_on_an_hf_pair(free):
    std = named_rule("standard_rejection")[0]
    rules = {"a": std, "b": std, "lenient": named_rule("leniency", 0.5)[0]}
    res = paired.compare(free, rules, "test", PROMPTS, BLOCKS, seed=2)
    assert res == paired.compare(free, rules, "test", PROMPTS, BLOCKS, seed=2)
    d = res["versus_reference"]["b"]
    for key in ("tokens_per_call", "tv_per_token", "target_loglik_per_token"):
        assert d[key]["difference"] == 0.0 and d[key]["se"] == 0.0
    a, le = res["rules"]["a"], res["rules"]["lenient"]
    assert a["tv_per_token"] < 1e-12 and le["tv_per_token"] > 0.01
    assert le["tokens_per_call"] > a["tokens_per_call"]
    # another seed draws other prompts and uniforms (the recorded traces' are a third draw)
    two, three = (paired.run_rule(free, std, "test", PROMPTS, BLOCKS, seed=s) for s in (2, 3))
    assert not np.array_equal(two["logp"], three["logp"])


def test_cli_compare_on_hf_traces_and_refusals(tmp_path, monkeypatch):
    target, draft = hfkit.tiny_pair(tmp_path / "models")
    prompts = hfkit.write_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "traces"
    r = clikit.invoke("data", "trace", "--backend", "hf", "--target", target, "--draft", draft,
                      "--prompts", prompts, "--block-size", G, "--top-k", K,
                      "--blocks-per-prompt", 2, "--out", out, env=ENV)
    assert r.exit_code == 0, r.output
    n_test = len(T.load(out / "test.npz").columns["sequence"]) // (2 * G)
    args = ("simulate", "--compare", "standard_rejection", "--compare", "leniency:0.6",
            "--data", out, "--blocks", 2)
    from evolve.cli import render
    monkeypatch.setattr(render._Meter, "PLAIN_EVERY", 0.0)    # a progress line every block
    r = clikit.invoke(*args, env=ENV)
    assert r.exit_code == 0, r.output
    for name in ("standard_rejection", "leniency(l=0.6)"):
        assert f"{name}: {n_test * 2 * G}/{n_test * 2 * G} drafted tokens" in r.stderr, r.stderr
    assert "eta" in r.stderr and "drafted tokens/s" in r.stderr
    monkeypatch.undo()
    r = clikit.invoke(*args, "--json", env=ENV)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["prompts"] == n_test and doc["corpus_matches_trace"]
    assert doc["rules"]["leniency(l=0.6)"]["tv_per_token"] > 0
    one_line_error(clikit.invoke(*args, "--prompts", n_test + 1, env=ENV), "--prompts",
                   str(prompts), f"has {n_test} prompts")
    one_line_error(clikit.invoke(*args[:-2], "--blocks", 200, env=ENV), "--blocks 200",
                   "at most 256")
    # a split whose recorded target is gone
    ts = T.load(out / "test.npz")
    ts.meta["config"]["target"] = str(tmp_path / "gone")
    T.save(ts, out / "test.npz")
    one_line_error(clikit.invoke(*args, env=ENV), "test.npz", "--target", "gone")


def test_lookahead_candidates_benchmark_runs_on_hf_traces(tmp_path):
    """benchmarks/experiments/lookahead_candidates.py at tiny sizes: one run per count of
    candidates on the same slots; with every one of the 256 tokens the cut's worst case
    is 0, with 16 it is a bound in (0, 1] where a slot has later slots."""
    from benchmarks.experiments import lookahead_candidates as LC
    target, draft = hfkit.tiny_pair(tmp_path / "models")
    prompts = hfkit.write_prompts(tmp_path / "prompts.jsonl")
    out = tmp_path / "traces"
    r = clikit.invoke("data", "trace", "--backend", "hf", "--target", target, "--draft", draft,
                      "--prompts", prompts, "--block-size", 4, "--top-k", K,
                      "--blocks-per-prompt", 2, "--out", out, env=ENV)
    assert r.exit_code == 0, r.output
    res = tmp_path / "cand.json"
    assert LC.main(["--data", str(out), "--candidates", "16", "256", "--prompts", "2",
                    "--blocks", "2", "--slots", "4", "--futures", "2", "--out", str(res)]) == 0
    doc = json.loads(res.read_text())
    assert doc["vocabulary"] == 256 and [r["candidates"] for r in doc["runs"]] == [16, 256]
    few, every = doc["runs"]
    assert few["block_position"] == every["block_position"] and len(few["slot_tv"]) == 4
    assert every["bound"] == [0.0] * 4 and every["largest_difference_from_most"] == 0.0
    later = [b < 3 for b in few["block_position"]]
    assert all((0 < x <= 1) == has for x, has in zip(few["bound"], later))
