"""The README's trace-results script runs end to end at tiny sizes; its tuned
baselines (every family of the rules table) and the choice of the best one."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from evolve.objectives import spec
from evolve.rules import headroom, tuning
from evolve.rules.table import RULES, engine_families
from tests import tracekit

ROOT = Path(__file__).resolve().parents[1]


def _script():
    from benchmarks.experiments import trace_results
    return trace_results


@pytest.fixture(scope="module")
def tiny_sas():
    return {s: spec.TraceArrays.from_split(tracekit.split(s)) for s in ("valid", "test")}


def test_tuned_baselines_cover_every_family_and_pick_the_best_on_valid(tiny_sas):
    tr = _script()
    budget = 0.03
    ls, pos = headroom.tune_position_leniency(tiny_sas["valid"], budget)
    table = tr.tuned_baselines(tiny_sas, budget, (ls, pos))
    want = {n for n in tuning.families() if n != "standard_rejection"} | {tr.POSITION}
    assert set(table) == want
    assert {"cactus", "fuzzy_sd"} | set(engine_families()) <= set(table)
    for name in ("cactus", "fuzzy_sd", "hf_ensemble", "leniency", "ears"):
        row = table[name]
        assert row["fits_valid"], name
        assert row["valid"]["tv_per_token"] <= budget
        ref = tuning.evaluate(name, tiny_sas["test"], row["param"]).objectives  # independent
        assert row["test"]["tokens_per_call"] == pytest.approx(ref.tokens_per_call, rel=1e-12)
    assert table["hf_ensemble"]["setting"].startswith("assistant_ensemble_weight=")
    for name in ("sglang_acc", "sglang_single"):     # top-k < vocabulary: not exact here
        assert not table[name]["fits_valid"] and "top-k" in table[name]["not_exact"]
    best = tr.best_baseline(table)
    fitted = {n: r["valid"]["tokens_per_call"] for n, r in table.items() if r["fits_valid"]}
    assert best == max(fitted, key=fitted.get)
    # a planted leader is chosen; no fitted row: none
    table["ears"]["valid"]["tokens_per_call"] = 1e9
    assert tr.best_baseline(table) == "ears"
    assert tr.best_baseline({k: dict(v, fits_valid=False) for k, v in table.items()}) is None
    label, rule = tr._baseline_rule("cactus", table["cactus"])
    assert label.endswith("(best tuned baseline)") and "cactus" in label
    label, rule = tr._baseline_rule("sglang_acc", {"param": 0.5, "label": "x"})
    assert rule.residual == RULES["sglang_acc"].residual


def test_engine_families_are_tuned_on_full_vocabulary_traces():
    """With top-k = vocabulary the SGLang knobs are exact and tuned like the others."""
    from tests.test_slot_features import _slots, _trace
    tr = _script()
    rng = np.random.default_rng(2)
    sas = {}
    for s in ("valid", "test"):
        P_, Q_ = _slots(seed=int(rng.integers(1000)), n=64, V=6)
        sas[s] = spec.TraceArrays.from_split(_trace(P_, Q_, g=4))
    table = tr.tuned_baselines(sas, 0.05)
    for name in ("sglang_acc", "sglang_single", "hf_ensemble", "cactus", "fuzzy_sd"):
        assert "not_exact" not in table[name], name
    assert any(table[n]["fits_valid"] for n in ("sglang_acc", "sglang_single"))
    b = {"budget": 0.05, "tuned_baselines": table,
         "best_tuned_baseline": {"rule": tr.best_baseline(table)}}
    text = "\n".join(tr.baselines_markdown(b))
    assert "| sglang_acc | sglang |" in text and "**(best)**" in text


@pytest.mark.slow
def test_trace_results_quick(tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.trace_results", "--quick",
                        "--data", str(tmp_path / "traces"), "--runs-dir", str(tmp_path / "runs"),
                        "--out", str(out), "--variants", "plain", "cap", "p99", "lookahead"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [b["budget"] for b in doc["budgets"]] == [0.01, 0.03]
    la = "evolved with lookahead, slot TV p99 capped"
    for b in doc["budgets"]:
        assert set(b["offline_test"]) == {
            "leniency (tuned)", "per-position leniency (tuned)", "evolved",
            "evolved, slot TV capped", "evolved, slot TV p99 capped", la,
            b["best_tuned_baseline"]["label"]}
        assert "--lookahead" in b["runs"][la]["command"]
        assert "--lookahead" not in b["runs"]["evolved, slot TV p99 capped"]["command"]
        assert la in b["free_running_test"]["rules"]
        best = b["best_tuned_baseline"]
        assert b["free_running_test"]["reference"] == best["label"]
        assert best["label"] in b["offline_test"]
        assert {"cactus", "fuzzy_sd", "hf_ensemble", "sglang_acc"} <= set(b["tuned_baselines"])
        for o in b["offline_test"].values():
            assert o["oracle_share"] <= 1.0 + 1e-9
        for run in b["runs"].values():
            assert "--budget-tv" in run["command"] and len(run["starts"]) == 2
        cap = b["runs"]["evolved, slot TV p99 capped"]["command"].split("--cap-tv-p99 ")[1]
        p99 = b["tuned_baselines"][best["rule"]]["valid"]["tv_p99"]
        assert float(cap.split()[0]) == round(p99, 6)     # no heavier a tail than the best's
    assert "| leniency (tuned) |" in r.stdout
    from evolve.lang import primitives as P, treeio
    reads = [P.uses_lookahead_inputs(treeio.parse(b["runs"][la]["tree"])) for b in doc["budgets"]]
    assert r.stdout.count("It reads a lookahead input: its offline numbers are an estimate") \
        == sum(reads)
    assert r.stdout.count("It reads neither lookahead input") == len(reads) - sum(reads)


@pytest.mark.slow
def test_trajectory_gap_quick(tmp_path):
    out = tmp_path / "gap.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.trajectory_gap", "--quick",
                        "--traces", str(tmp_path / "traces"), "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert [b["budget"] for b in doc["budgets"]] == [0.01, 0.03]
    for b in doc["budgets"]:
        ref = b["rules"]["leniency (tuned)"]
        assert "margin" not in ref and ref["free_running"]["se"] > 0
        for label, row in b["rules"].items():
            if label != "leniency (tuned)":
                assert set(row["margin"]) == {"offline", "trajectory", "free"}
    assert "trajectory-aware minus free-running" in r.stdout


@pytest.mark.slow
def test_engine_results_quick_decode_every_engine_knob(tmp_path):
    """`make results-engines` at tiny sizes: traces with every byte a candidate make the
    SGLang knobs exact, so every engine family is tuned and decoded free-running, and no
    champion is evolved."""
    out = tmp_path / "engines.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.trace_results", "--quick",
                        "--top-k", "256", "--variants", "--engines",
                        "--data", str(tmp_path / "traces"), "--runs-dir", str(tmp_path / "runs"),
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert "no evolved champions" in r.stdout
    for b in doc["budgets"]:
        assert b["runs"] == {}
        for name in ("hf_ensemble", "sglang_acc", "sglang_single"):
            row = b["tuned_baselines"][name]
            assert "not_exact" not in row, name
            if row["fits_valid"] and name != b["best_tuned_baseline"]["rule"]:
                assert f"{row['label']} (tuned)" in b["free_running_test"]["rules"], name


@pytest.mark.slow
def test_value_gate_quick(tmp_path):
    """benchmarks/experiments/value_gate.py end to end at tiny sizes: the reference and both gates
    tuned on valid, decoded paired once per seed, the gate that reads ahead labelled an
    estimate offline and free-running."""
    out = tmp_path / "gate.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.experiments.value_gate", "--quick",
                        "--data", str(tmp_path / "traces"), "--out", str(out),
                        "--budgets", "0.03", "--seeds", "1", "2"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    (b,) = doc["budgets"]
    ref = "per-position leniency (tuned)"
    assert list(b["offline_test"]) == [ref, "value gate", "value gate reading ahead"]
    assert len(b["free_running_test"]) == 2
    for f, seed in zip(b["free_running_test"], (1, 2)):
        assert f["seed"] == seed and f["reference"] == ref
        assert f["rules"]["value gate reading ahead"]["distortion"]["kind"] == "estimate"
        assert f["rules"]["value gate"]["distortion"]["kind"] == "exact"
    for label in ("value gate", "value gate reading ahead"):
        d = [f["versus_reference"][label]["tokens_per_call"]["difference"]
             for f in b["free_running_test"]]
        assert b["spread"][label]["mean"] == pytest.approx(sum(d) / 2)
        assert b["offline_test"][label]["params"]["tv_cap"] == b["tv_cap"]
        assert b["offline_test"][label]["tv_p99"] <= b["tv_cap"] + 1e-12   # no slot spends more
    assert "| value gate reading ahead |" in r.stdout and "(estimate)" in r.stdout
    assert doc["out"] == str(out) and f"figures in `{out}`" in r.stdout   # --out, not the default


def test_real_results_runs_every_step_and_leaves_out_the_skipped(tmp_path, monkeypatch):
    """`make results-real` (benchmarks/experiments/real_results.py): the pair, the TV
    world's three studies (plain and p99 champions, the lookahead champions, the value
    gates), the task world and the answer oracle, each writing its own section; --skip
    and --modes leave steps out; recordings that exist are not made again."""
    from benchmarks.experiments import (oracle_judge, real_oracle, real_results,
                                        task_results, trace_results, value_gate)
    calls = []
    monkeypatch.setattr(real_results, "_evolve", lambda *a: calls.append(
        ("evolve", " ".join(map(str, a)))))
    for mod, name in ((trace_results, "traces"), (value_gate, "value-gate"),
                      (task_results, "task"), (real_oracle, "oracle"),
                      (oracle_judge, "oracle-judge")):
        monkeypatch.setattr(mod, "main", lambda argv, name=name: calls.append((name, argv)))
    pair = tmp_path / "pair"
    for split in ("results/traces", "results/task/greedy"):
        (pair / split).mkdir(parents=True)
        (pair / split / "test.npz").write_bytes(b"")
    real_results.main(["--pair", str(pair), "--page"])
    names = [c[0] for c in calls]
    assert names == ["evolve", "traces", "traces", "value-gate", "evolve", "task", "oracle",
                     "oracle-judge"]
    assert calls[0][1].startswith("data pair smollm2")
    assert calls[4][1].startswith("data task") and "--decoding sample" in calls[4][1]
    sections = [c[1][c[1].index("--section") + 1] for c in calls if "--section" in c[1]]
    assert sections == ["real-trace-results", "real-lookahead-results", "real-value-gate",
                        "real-task-results", "real-oracle-judge"]
    judge = calls[-1][1]                 # the greedy recording, its study's own sizes
    assert judge[:2] == ["--data", str(pair / "results/task/greedy")]
    assert judge[judge.index("--out") + 1] == "benchmarks/experiments/real_oracle_judge.json"
    assert calls[1][1][calls[1][1].index("--variants") + 1:][:2] == ["plain", "p99"]
    assert calls[2][1][calls[2][1].index("--variants") + 1] == "lookahead"
    assert all("--page" in c[1] for c in calls if c[0] != "evolve")
    for c in calls[1:4]:                     # the TV world's studies: the estimate's slots
        assert c[1][c[1].index("--lookahead-slots") + 1] == "100"
        # the commands the pages show name the checkout's files as a user types them
        assert c[1][c[1].index("--out") + 1].startswith("benchmarks/experiments/real_")
    for section in sections[:3] + ["real-oracle", "real-oracle-judge"]:   # on the page
        assert f"<!-- {section}:begin -->" in (ROOT / "docs/results/real-pair.md").read_text()
    calls.clear()
    real_results.main(["--pair", str(pair), "--modes", "greedy",
                       "--skip", "lookahead", "value-gate", "oracle"])
    assert [c[0] for c in calls] == ["evolve", "traces", "task", "oracle-judge"]
    assert "--page" not in calls[1][1] and calls[2][1][calls[2][1].index("--modes") + 1:][:2] \
        == ["greedy", "--budgets"]
    calls.clear()
    real_results.main(["--pair", str(pair), "--modes", "sample",
                       "--skip", "traces", "lookahead", "value-gate", "task"])
    assert [c[0] for c in calls] == ["evolve", "oracle"]        # greedy recordings only


def test_real_results_ledger_resumes_where_a_run_stopped(tmp_path, monkeypatch, capsys):
    """results-real's ledger: a step that finished is kept by --resume (with the same
    settings; another setting, or a page not yet written, runs it again), a step that
    failed is not recorded as finished and its time is kept as cut off, and a process
    killed mid-step leaves its time under `running`, which the next run counts as cut off."""
    from benchmarks.experiments import (oracle_judge, real_oracle, real_results,
                                        task_results, trace_results, value_gate)
    calls, fail = [], set()
    monkeypatch.setattr(real_results, "_evolve", lambda *a: None)

    def study(name):
        def main(argv):
            calls.append(name)
            if name in fail:
                raise RuntimeError(name)
        return main
    for mod, name in ((trace_results, "traces"), (value_gate, "value-gate"),
                      (task_results, "task"), (real_oracle, "oracle"),
                      (oracle_judge, "oracle-judge")):
        monkeypatch.setattr(mod, "main", study(name))
    pair = tmp_path / "pair"
    (pair / "draft").mkdir(parents=True)
    for split in ("results/traces", "results/task/greedy", "results/task/sample"):
        (pair / split).mkdir(parents=True)
        (pair / split / "test.npz").write_bytes(b"")
    fail.add("task")
    with pytest.raises(RuntimeError):
        real_results.main(["--pair", str(pair), "--resume"])
    assert calls == ["traces", "traces", "value-gate", "task"]
    led = json.loads((pair / "results/steps.json").read_text())
    assert set(led["steps"]) == {"traces", "lookahead", "value-gate"}
    assert [c["step"] for c in led["interrupted"]] == ["task"] and "running" not in led
    calls.clear()
    fail.clear()
    real_results.main(["--pair", str(pair), "--resume"])
    assert calls == ["task", "oracle", "oracle-judge"]           # the finished ones kept
    calls.clear()
    real_results.main(["--pair", str(pair), "--resume", "--starts", "3"])
    assert calls == ["traces", "traces", "task"]                 # another setting: again
    calls.clear()
    real_results.main(["--pair", str(pair), "--resume", "--page", "--skip", "task"])
    assert calls == ["traces", "traces", "value-gate", "oracle", "oracle-judge"]
    calls.clear()
    real_results.main(["--pair", str(pair)])                     # without --resume: all
    assert calls == ["traces", "traces", "value-gate", "task", "oracle", "oracle-judge"]
    # a process killed in a step: its last beat is under `running`
    led = json.loads((pair / "results/steps.json").read_text())
    led["running"] = {"step": "lookahead", "seconds": 1234.5}
    (pair / "results/steps.json").write_text(json.dumps(led))
    ledger = real_results.Ledger(pair / "results/steps.json")
    assert ledger.d["interrupted"][-1] == {"step": "lookahead", "seconds": 1234.5}
    assert "running" not in json.loads((pair / "results/steps.json").read_text())
    done, cut = ledger.minutes()
    assert cut >= 1234.5 / 60 and done >= 0
    calls.clear()
    real_results.main(["--pair", str(pair), "--times"])         # prints, runs nothing
    out = capsys.readouterr().out
    assert calls == [] and "oracle-judge" in out and "lookahead" in out
    assert f"{cut:>8.1f}" in out.splitlines()[-1]              # the time cut off, last
    for bad in ("{", '{"steps": {"traces": {"seconds": 1}}}', "[]"):
        (pair / "results/steps.json").write_text(bad)
        with pytest.raises(SystemExit, match="steps.json: not a results-real ledger"):
            real_results.main(["--pair", str(pair), "--resume"])
    assert calls == []                                         # nothing ran


def test_ledger_beats_while_a_step_runs(tmp_path):
    """The running step's elapsed time reaches the file while it runs (what a killed
    process leaves behind)."""
    from benchmarks.experiments.real_results import Ledger
    ledger = Ledger(tmp_path / "steps.json", beat=0.01)
    seen, give_up = [], time.monotonic() + 120
    with ledger.step("traces", {"starts": 1}):
        while not seen or seen[-1] <= 0:        # wait for a beat, not for a guessed time
            assert time.monotonic() < give_up, "no beat reached the ledger"
            seen.append(json.loads((tmp_path / "steps.json").read_text())
                        ["running"]["seconds"])
            time.sleep(0.005)
    d = json.loads((tmp_path / "steps.json").read_text())
    assert "running" not in d and d["steps"]["traces"]["settings"] == {"starts": 1}
    assert d["steps"]["traces"]["seconds"] >= seen[-1] > 0


def test_a_studys_time_reads_as_the_page_states_it():
    """The studies' pages give their time in words, one minute singular."""
    from benchmarks.common import minutes
    assert [minutes(s) for s in (20, 84.7, 150.9, 3000)] == [
        "under a minute", "1 minute", "3 minutes", "50 minutes"]
