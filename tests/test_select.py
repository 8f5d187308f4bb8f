"""A task run's champion chosen free-running (evolve.freerun.select): the tree written
is the rule that was judged, the choice and the verdict come from free-running
decoding on valid, and the lossless rule is chosen where nothing saves calls."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evolve.data.sources.task import record
from evolve.freerun import select
from evolve.freerun import task_compare as TC
from evolve.lang import treeio
from evolve.lang.features import ALL_INPUT_NAMES
from evolve.objectives.task_data import task_data
from evolve.rules.adapters import TreeRule
from evolve.standing import LOSES, WINS
from evolve.tasks.task import freerun_verdict
from tests.clikit import invoke, one_line_error

# rules whose thresholds run below 0 and above 1 (the clip matters)
TREES = ("sub(mul(3.0, target_prob), draft_entropy)",
         "pdiv(target_prob, sub(draft_prob, q_max))")


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("tree", TREES)
def test_the_written_tree_is_the_step_from_lossless_that_was_decoded(task_greedy_small,
                                                                    tree, alpha, greedy):
    """``between_tree`` gives, on every drafted row of a recorded split, the thresholds
    the decoders clip (``task_compare.between``)."""
    from evolve.lang.numpy_eval import evaluate
    X = task_data(record.load(task_greedy_small, "valid")).X
    assert X.shape[0] == len(ALL_INPUT_NAMES)
    F = {n: X[i] for i, n in enumerate(ALL_INPUT_NAMES)}
    want = TC.between(TreeRule(treeio.parse(tree)), alpha, greedy).many(F)
    got = evaluate(treeio.parse(select.between_tree(tree, alpha, greedy)), F)
    from evolve.data.decode import clipped
    assert np.array_equal(clipped(np.broadcast_to(got, want.shape)), clipped(want))


@pytest.fixture(scope="module")
def chosen(task_greedy_small, tmp_path_factory):
    runs = tmp_path_factory.mktemp("select-runs")
    r = invoke("run", "--objective", "task_speed", "--data", task_greedy_small,
               "--generations", 2, "--population", 20, "--seed", 3, "--budget-critical",
               0.05, "--select-problems", 12, "--budget-agreement", 0.5, "--runs-dir", runs,
               "--name", "sel")
    assert r.exit_code == 0, r.output
    return r.output, json.loads((runs / "sel" / "champion.json").read_text())


def test_a_task_run_chooses_and_judges_its_champion_free_running(chosen, task_pair_small):
    output, ch = chosen
    sel = ch["selection"]
    assert ch["tree"] == sel["tree"] and sel["problems"] == 12 and sel["budget"] == 0.05
    assert sel["agreement_budget"] == 0.5 and 1.0 - sel["valid"]["agreement"] <= 0.5
    # the champion, decoded again free-running, is what the choice saw
    raw = TC.run_rule(task_pair_small, TreeRule(treeio.parse(ch["tree"])), "valid", 12, True)
    ref = TC.run_rule(task_pair_small, None, "valid", 12, True)
    s = TC.summary(raw, ref)
    assert s["calls_per_correct"] == pytest.approx(sel["valid"]["calls_per_correct"])
    assert TC.drop_of(raw, ref) == pytest.approx(sel["drop"]) and sel["drop"] <= 0.05
    st = ch["standing"]
    assert st["verdict"] == (WINS if sel["source"] is not None else LOSES)
    assert "recorded_path" in st and f"free-running on 12 valid problems" in st["why"]
    assert "free-running on 12 valid problems" in output
    assert "evolve tradeoff --data" in output or st["verdict"] != WINS


def test_without_selection_the_champion_is_chosen_on_the_recorded_path(task_greedy_small,
                                                                       tmp_path):
    r = invoke("run", "--objective", "task_speed", "--data", task_greedy_small,
               "--generations", 1, "--population", 20, "--seed", 3, "--select-problems", 0,
               "--runs-dir", tmp_path, "--name", "rec")
    assert r.exit_code == 0, r.output
    ch = json.loads((tmp_path / "rec" / "champion.json").read_text())
    assert "selection" not in ch and "recorded_path" not in ch["standing"]
    assert "free-running" not in ch["standing"]["why"]


def test_where_nothing_saves_calls_the_lossless_rule_is_chosen(task_pair_small):
    """A rule that accepts nothing beyond lossless decodes exactly as lossless at every
    alpha: no choice saves a call, so the champion is the lossless rule."""
    sel = select.select(task_pair_small, ["0.0"], 0.05, True, 6)
    assert sel["source"] is None and sel["alpha"] == 0.0 and sel["tree"] == "0.0"
    assert sel["valid"] == sel["lossless"]
    verdict, why = freerun_verdict(sel)
    assert verdict == LOSES and "the champion is the lossless rule" in why


def test_an_agreement_budget_bounds_the_answers_the_choice_changes(monkeypatch):
    """``--budget-agreement``: of the steps from lossless, the choice keeps the one with
    the fewest calls per correct answer whose share of answers changed from lossless is
    within the bound too; without it the steps that change more answers are allowed.
    (A fake decoder: alpha a saves calls and changes a share a / 2 of the answers,
    all still right.)"""
    n = 40

    def fake(pair, rule, split, prompts, greedy):
        a = 0.0 if rule is None else rule
        changed = int(round(n * a / 2))
        return {"correct": np.ones(n, bool), "tokens": np.full(n, 20.0),
                "calls": np.full(n, 10.0 / (1.0 + a)),
                "answers": ["b"] * changed + ["a"] * (n - changed)}

    monkeypatch.setattr(TC, "run_rule", fake)
    monkeypatch.setattr(TC, "between", lambda rule, a, greedy: a)
    free = select.select(None, ["target_prob"], 0.05, True, n)
    assert free["alpha"] == 1.0 and free["valid"]["agreement"] == 0.5
    assert free["agreement_budget"] is None
    held = select.select(None, ["target_prob"], 0.05, True, n, agreement_budget=0.1)
    assert 0.2 <= held["alpha"] < 0.25 and 1.0 - held["valid"]["agreement"] <= 0.1
    assert held["valid"]["calls_per_correct"] > free["valid"]["calls_per_correct"]
    verdict, why = freerun_verdict(held)
    assert verdict == WINS and "(at least 0.9)" in why


def test_the_task_tradeoff_reports_per_answer_with_the_oracle_headroom(task_greedy_small,
                                                                      tmp_path):
    """`evolve tradeoff --data TASK --oracle`: sizes from the data, every rule's calls per
    correct answer, the oracle's row (greedy: every answer the lossless one) and each
    rule's share of the oracle's saving."""
    r = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 6,
               "--oracle", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["sizes"] == {"train": 60, "valid": 24, "test": 24}
    assert doc["problems"] == {"valid": 6, "test": 6}
    rows = doc["budgets"][0]["rows"]
    (oracle,) = [x for x in rows if x["kind"] == "oracle"]
    assert oracle["test"]["agreement"] == 1.0 and oracle["oracle_share"] is None
    lossless = doc["lossless"]["test"]["calls_per_correct"]
    room = lossless - oracle["test"]["calls_per_correct"]
    for x in rows:
        if x["kind"] != "oracle" and x["test"] is not None and room > 0:
            assert x["oracle_share"] == pytest.approx(
                (lossless - x["test"]["calls_per_correct"]) / room)
    text = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 3,
                  "--oracle-prompts", 2, "--family", "leniency")
    assert text.exit_code == 0 and "of oracle" in text.output and "calls/correct" in text.output
    assert "on the first 2 test problems" in " ".join(text.output.split())
    plain = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 2,
                   "--family", "leniency", "--json")
    assert not any(x["kind"] == "oracle" for x in json.loads(plain.stdout)["budgets"][0]["rows"])


def test_the_task_tradeoff_of_named_families_tunes_only_those(task_greedy_small):
    """`--family` on task traces: only the named families (and the learned judge only when
    `learned_judge` is named); a family of the other decoding is a one-line error."""
    r = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 3,
               "--family", "leniency", "--json")
    assert r.exit_code == 0, r.output
    assert [x["rule"] for x in json.loads(r.stdout)["budgets"][0]["rows"]] == ["leniency"]
    assert json.loads(r.stdout)["judge"] is None
    r = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 3,
               "--family", "learned_judge", "--family", "leniency", "--json")
    assert r.exit_code == 0, r.output
    assert [x["kind"] for x in json.loads(r.stdout)["budgets"][0]["rows"]] == ["family",
                                                                               "judge"]
    bad = invoke("tradeoff", "--data", task_greedy_small, "--family", "sglang_acc")
    one_line_error(bad, "sglang_acc", "decoded greedy")


def test_the_oracle_on_fewer_test_problems_measures_every_share_on_them(task_greedy_small,
                                                                      task_pair_small):
    """`oracle=N` (`--oracle-prompts N`): the oracle decodes the first N test problems
    only (it costs many decodings), and its row and every rule's share are measured on
    those N problems, paired: the shares are those of decoding each rule on them."""
    from evolve.rules.adapters import named_rule
    from evolve.rules.oracle import AnswerOracle
    train = task_data(record.load(task_greedy_small, "train"))
    doc = TC.tradeoff(task_pair_small, train, [0.05], greedy=True,
                      families=["leniency", "fuzzy_sd", "trtllm_relaxed"], prompts=6, oracle=3)
    assert doc["oracle_problems"] == 3 and doc["problems"]["test"] == 6
    rows = doc["budgets"][0]["rows"]
    (oracle,) = [x for x in rows if x["kind"] == "oracle"]
    ref = TC.run_rule(task_pair_small, None, "test", 3, True)
    got = TC.run_rule(task_pair_small, AnswerOracle(), "test", 3, True)
    assert oracle["test"]["problems"] == 3
    assert oracle["test"]["calls_per_correct"] == pytest.approx(
        TC.summary(got, ref)["calls_per_correct"])
    lossless = TC.summary(ref, ref)["calls_per_correct"]
    room = lossless - oracle["test"]["calls_per_correct"]
    assert room > 0
    checked = 0
    for x in rows:
        if x["kind"] == "family" and x["test"] is not None:
            mine = TC.run_rule(task_pair_small, named_rule(x["rule"], x["param"], True)[0],
                               "test", 3, True)
            assert x["oracle_share"] == pytest.approx(
                (lossless - TC.summary(mine, ref)["calls_per_correct"]) / room)
            checked += 1
    assert checked
    one_line_error(invoke("tradeoff", "--data", task_greedy_small, "--oracle-prompts", 1),
                   "--oracle-prompts", "a whole number >= 2")


def test_the_oracle_is_refused_on_traces_in_one_line(tmp_path):
    one_line_error(invoke("tradeoff", "--data", tmp_path, "--oracle"), "--oracle",
                   "only on task traces")


def test_the_start_kept_is_the_free_running_choice_not_the_recorded_one():
    from evolve.runs.multistart import best_start

    def start(seed, score, calls):
        sel = {"valid": {"calls_per_correct": calls}} if calls != "none" else None
        return {"seed": seed, "valid_score": score, "size": 5,
                "champion": {"selection": sel} if sel else {}}
    # recorded path prefers seed 1; free-running, seed 2 takes fewer calls per answer
    assert best_start([start(1, 3.0, 21.0), start(2, 2.5, 20.0)])["seed"] == 2
    assert best_start([start(1, 3.0, None), start(2, 2.5, 30.0)])["seed"] == 2  # no right answer
    assert best_start([start(1, 3.0, "none"), start(2, 2.5, "none")])["seed"] == 1


@pytest.mark.parametrize("greedy", [True, False])
def test_a_step_of_0_decodes_as_the_lossless_rule(task_pair_small, greedy):
    """Why tuning takes alpha 0 from the lossless run (``task_compare.lossless_step``)
    instead of decoding it again: on the same problems and uniforms it is that run."""
    rule = TreeRule(treeio.parse(TREES[0]))
    a = TC.run_rule(task_pair_small, None, "valid", 6, greedy)
    b = TC.run_rule(task_pair_small, TC.between(rule, 0.0, greedy), "valid", 6, greedy)
    assert all(np.array_equal(a[k], b[k]) for k in ("correct", "tokens", "calls"))
    assert a["answers"] == b["answers"]
    assert TC.lossless_step(a)[0.0] == (TC.summary(b, a), TC.drop_of(b, a))


def test_a_draft_cost_reports_time_per_correct_answer_and_the_speedup_over_the_target(
        task_greedy_small, tmp_path):
    """`evolve tradeoff --data TASK --draft-cost C`: a call verifying g drafts costs
    1 + g C target calls; each rule's time per correct answer is its calls per correct
    answer times that, its speed-up the target alone's calls per correct answer (one a
    token of the lossless text) over it, so lossless's is its tokens per call over
    1 + g C; differences scale alike; a bad cost, or one on TV traces, is one line."""
    r = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 4,
               "--family", "leniency", "--family", "trtllm_relaxed", "--draft-cost", 0.25,
               "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    g = record.load(task_greedy_small, "valid").meta["block_size"]
    per = 1 + g * 0.25
    assert doc["time_model"] == {"draft_cost": 0.25, "block_size": g, "call_cost": per}
    ll = doc["lossless"]["test"]
    alone = ll["answer_tokens"] / ll["accuracy"]
    assert ll["speedup"] == pytest.approx(ll["tokens_per_call"] / per, rel=1e-12)
    checked = 0
    for x in doc["budgets"][0]["rows"]:
        t = x["test"]
        if t is None:
            continue
        assert t["time_per_correct"] == pytest.approx(t["calls_per_correct"] * per)
        assert t["speedup"] == pytest.approx(alone / t["time_per_correct"])
        d = x["versus_lossless"]
        assert d["time_per_correct"]["ci95"] == pytest.approx(
            [v * per for v in d["calls_per_correct"]["ci95"]])
        checked += 1
    assert checked == 2
    text = invoke("tradeoff", "--data", task_greedy_small, "--budget", 0.05, "--prompts", 3,
                  "--family", "leniency", "--draft-cost", 0.25)
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert "time/correct" in flat and "1.25x the target alone" in flat and "= 2 " in flat
    one_line_error(invoke("tradeoff", "--data", task_greedy_small, "--draft-cost", -1),
                   "--draft-cost", ">= 0")
    one_line_error(invoke("tradeoff", "--data", tmp_path, "--draft-cost", 0.3),
                   "--draft-cost", "only on task traces")
