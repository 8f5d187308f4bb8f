"""Paired free-running comparison (evolve.freerun.paired, evolve simulate --compare)."""

import json

import numpy as np
from click.testing import CliRunner

from evolve.freerun import paired
from evolve.cli import main
from evolve.data.sources import ngram as NG, ngram_free
from evolve.rules.adapters import named_rule
from tests import tracekit

PROMPTS, BLOCKS = 48, 6


def _rules(*specs):
    return {f"{n}:{p}": named_rule(n, p)[0] for n, p in specs}


def test_standard_rule_is_exact_and_a_rule_against_itself_differs_by_nothing():
    pair = tracekit.pair()
    rules = {"a": named_rule("standard_rejection")[0], "b": named_rule("standard_rejection")[0]}
    res = paired.compare(pair, rules, "test", PROMPTS, BLOCKS, seed=2)
    a = res["rules"]["a"]
    assert a["tv_per_token"] < 1e-12 and a["kl_per_token"] < 1e-12 and a["slot_tv_p99"] < 1e-12
    d = res["versus_reference"]["b"]
    for key in ("tokens_per_call", "tv_per_token", "target_loglik_per_token"):
        assert d[key]["difference"] == 0.0 and d[key]["se"] == 0.0


def test_same_seed_same_numbers_and_tokens_match_plain_decoding():
    pair = tracekit.pair()
    rules = _rules(("standard_rejection", None), ("leniency", 0.7))
    r1 = paired.compare(pair, rules, "test", PROMPTS, BLOCKS, seed=3)
    r2 = paired.compare(pair, rules, "test", PROMPTS, BLOCKS, seed=3)
    assert r1 == r2
    # the tokens of a rule are its own decoding's: counted acceptances + 1 per call
    raw = paired.run_rule(pair, rules["leniency:0.7"], "test", PROMPTS, BLOCKS, 3)
    assert np.isclose(r1["rules"]["leniency:0.7"]["tokens_per_call"],
                      raw["tokens"].sum() / (PROMPTS * BLOCKS), rtol=1e-12)


def test_lenient_rule_buys_tokens_pays_distortion_and_pairing_shrinks_the_error():
    pair = tracekit.pair()
    rules = _rules(("standard_rejection", None), ("leniency", 0.9))
    res = paired.compare(pair, rules, "test", PROMPTS, BLOCKS, seed=4)
    std, len_ = res["rules"]["standard_rejection:None"], res["rules"]["leniency:0.9"]
    d = res["versus_reference"]["leniency:0.9"]["tokens_per_call"]
    assert len_["tv_per_token"] > 0.005 and len_["kl_per_token"] > 0
    assert d["ci95"][0] < d["difference"] < d["ci95"][1]
    # common random numbers: the paired error is well below the unpaired one
    assert d["se"] < 0.7 * np.hypot(std["tokens_se"], len_["tokens_se"])


def test_free_running_distortion_is_the_exact_output_distance():
    """The TV summed along a trajectory is the exact per-slot TV of the rule's output:
    recomputed here from first principles for a few reached rows."""
    from evolve.data import decode as DEC
    pair = tracekit.pair()
    rule = named_rule("leniency", 0.8)[0]
    raw = paired.run_rule(pair, rule, "test", 8, 2, 5)
    # one reached slot by hand
    sim_pair = ngram_free.seeded_pair(pair, 5)
    pr, rngs = NG.prompt_starts(sim_pair, "test", 8)
    cols, acc = DEC.decode(pair, pr, rngs, 2, rule=rule, record=True)
    r = 0                                       # block position 0 is always reached
    ctx = cols["context"][r:r + 1]
    p = pair.target.probs(ctx)[0]
    q = pair.draft.probs(ctx)[0]
    a_std = np.minimum(1, p / q)
    top = np.argsort(-q, kind="stable")[:pair.config.top_k]
    a = a_std.copy()
    a[top] = np.minimum(1, p[top] / (0.8 * q[top]))
    res = np.maximum(p - q, 0)
    out = q * a + (1 - (q * a).sum()) * res / res.sum()
    assert np.isclose(raw["slot_tv"][0], 0.5 * np.abs(out - p).sum(), rtol=1e-9)


def test_cli_compare_json_and_bad_rules(tmp_path):
    d = tmp_path / "tiny"
    NG.build_splits(tracekit.TINY, d)
    r = CliRunner().invoke(main, ["simulate", "--compare", "standard_rejection", "--compare",
                                  "leniency:0.8", "--data", str(d), "--prompts", "16",
                                  "--blocks", "2", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["reference"] == "standard_rejection"
    assert set(doc["versus_reference"]) == {"leniency(l=0.8)"}
    for bad, words in ((["--compare", "nope", "--compare", "leniency"], "unknown rule"),
                       (["--compare", "leniency:x", "--compare", "leniency"], "not a number"),
                       (["--compare", "leniency"], "at least two")):
        r = CliRunner().invoke(main, ["simulate", *bad, "--data", str(d)])
        assert r.exit_code == 2 and words in r.output, r.output


def test_tv_by_distance_from_the_prompt_reads_each_slot_s_place_in_its_answer():
    """A slot's distance from the prompt, from the accepted counts, is the decoder's own
    record of the tokens generated before it (its ``position`` column); the bins' TV are
    the slots' mean, and together they hold every reached slot."""
    from evolve.data import decode as DEC
    pair = tracekit.pair()
    rule = named_rule("leniency", 0.9)[0]
    pr, rngs = NG.prompt_starts(ngram_free.seeded_pair(pair, 4), "test", 12)
    cols, accepted, _, _ = DEC.decode(pair, pr, rngs, BLOCKS, DEC.BATCH, rule=rule,
                                      record=True, history=True)
    reached = cols["block_position"] <= np.repeat(accepted.reshape(-1), pair.config.block_size)
    d = paired.distance_from_prompt(accepted, cols["sequence"][reached],
                                    cols["block_index"][reached],
                                    cols["block_position"][reached])
    assert np.array_equal(d, cols["position"][reached]) and d.min() == 0
    raw = paired.run_rule(pair, rule, "test", 12, BLOCKS, 4)
    bins = paired.tv_by_distance(raw)
    assert sum(b["slots"] for b in bins.values()) == raw["slot_tv"].size
    first = raw["slot_distance"] == 0
    assert bins["0"]["tv"] == raw["slot_tv"][first].mean() and bins["0"]["slots"] == 12
    r = paired.compare(pair, {"std": named_rule("standard_rejection")[0], "len": rule},
                       "test", 12, BLOCKS, seed=4)
    assert all(v["tv"] < 1e-12 for v in r["rules"]["std"]["tv_by_distance"].values())
    assert r["rules"]["len"]["tv_by_distance"] == bins
