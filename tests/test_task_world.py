"""The task world end to end (evolve/data/sources/task/record.py,
evolve/objectives/task_objectives.py, evolve/rules/judge.py, evolve/freerun/task_compare.py,
evolve/tasks/task.py, `evolve data task`, `evolve simulate-task`): recorded traces and
labels round-trip and are refused when they do not belong together; the task
objectives equal a slow per-block reference that reads every input by name; lossless
speculative decoding of the task emits the target's own greedy text; a rule between
the standard rule and another is each of them at its ends; tuning by free-running
accuracy keeps the most tokens within the budget; the learned judge decides
free-running as it decides offline; the commands run a run and a comparison.

Guarantee 39 of docs/reliability.md, Task commands check what they can before any work:
`evolve data task` refuses zero prompts (once read as the default) and an --out it
cannot write before the pair is built (`test_data_task_refuses_before_any_work`);
labels with a bool version or on a draft the standard rule never rejects are refused
(`test_a_bool_version_and_labels_the_standard_rule_never_needs_are_refused`);
`evolve simulate-task` refuses a decoding it does not know
(`test_simulate_task_refuses_an_unknown_decoding`). With your own pair:
tests/test_task_hf.py (`test_positions_are_checked_before_the_models_load`, an empty
--delimiter in `test_refusals_are_one_line`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from evolve.freerun import task_compare as TC
from evolve.data import labels as LB
from evolve.data.sources.task import greedy as GR
from evolve.data.sources.task import pair as TP
from evolve.data.sources.task import record
from evolve.data.tokens import DataError
from evolve.lang import treeio
from evolve.lang.features import ALL_INPUT_NAMES, BY_NAME, SLOT_SIGNATURE
from evolve.objectives import task_data as TO
from evolve.objectives import OBJECTIVES
from evolve.objectives.task_data import TaskData, metrics_of
from evolve.rules import judge
from evolve.rules.adapters import named_rule
from evolve.rules.table import RATIO, RULES
from tests.clikit import invoke, isolated, one_line_error  # noqa: F401 (isolated: a fixture)

pytestmark = pytest.mark.usefixtures("isolated")

SMALL = TP.TaskPairConfig(train_prompts=60, valid_prompts=24, test_prompts=24)


@pytest.fixture(scope="module")
def pair(task_pair_small):
    assert task_pair_small.config.train_prompts == SMALL.train_prompts
    return task_pair_small


@pytest.fixture(scope="module")
def recorded(task_greedy_small):
    """Greedy task traces of SMALL, recorded and saved (once per session: conftest)."""
    return task_greedy_small


@pytest.fixture(scope="module")
def sampled(pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("task-sample")
    record.save(record.record_split(pair, "valid", "sample", 0, prompts=12), d)
    return d


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------ traces and labels

def test_recorded_traces_and_labels_round_trip(pair, recorded):
    ts = record.load(recorded, "valid")
    again = record.record_split(pair, "valid", "greedy", 0)
    assert ts.meta["decoding"] == "greedy" and ts.meta["backend"] == "task"
    for f, v in again.traces.columns.items():
        np.testing.assert_array_equal(ts.traces.columns[f], v, err_msg=f)
    np.testing.assert_array_equal(ts.critical, again.critical)
    assert (ts.critical == 1).any() and (ts.critical == 0).any()
    assert ts.labels_meta["mined"]["target_forward_rows"] > 0


def test_labels_of_other_traces_are_refused(recorded, tmp_path):
    d = _copy(recorded, tmp_path / "d")
    shutil.copy(d / "test.labels.npz", d / "valid.labels.npz")
    with pytest.raises(DataError, match=r"valid\.labels\.npz: field 'traces_sha256' does not "
                                        r"match valid\.npz"):
        record.load(d, "valid")


def test_missing_labels_and_a_wrong_version_are_refused(recorded, tmp_path):
    from evolve.data import tokens as D
    d = _copy(recorded, tmp_path / "d")
    meta, crit = LB.read_labels(d / "valid.labels.npz")
    D.write_npz(d / "valid.labels.npz", dict(meta, labels_version=99),
                {"critical.npy": crit})
    with pytest.raises(DataError, match="field 'labels_version' is 99; expected 1"):
        record.load(d, "valid")
    bad = crit.copy()
    bad[np.flatnonzero(bad >= 0)[0]] = -1
    D.write_npz(d / "valid.labels.npz", meta, {"critical.npy": bad})
    with pytest.raises(DataError, match="field 'critical' row .*no label for a draft"):
        record.load(d, "valid")
    bad = crit.copy()
    bad[3] = 2
    D.write_npz(d / "valid.labels.npz", meta, {"critical.npy": bad})
    with pytest.raises(DataError, match="field 'critical' row 3: 2 is not -1, 0 or 1"):
        record.load(d, "valid")
    (d / "valid.labels.npz").unlink()
    with pytest.raises(DataError, match="the labels of valid.npz are missing"):
        record.load(d, "valid")


def test_a_bool_version_and_labels_the_standard_rule_never_needs_are_refused(recorded,
                                                                             tmp_path):
    """True == 1 in Python, but a bool is not a version; a label on a draft the standard
    rule always keeps would still change the learned judge, which fits every label."""
    from evolve.data import tokens as D
    d = _copy(recorded, tmp_path / "d")
    meta, crit = LB.read_labels(d / "valid.labels.npz")
    D.write_npz(d / "valid.labels.npz", dict(meta, labels_version=True),
                {"critical.npy": crit})
    with pytest.raises(DataError, match="field 'labels_version' is True; expected 1"):
        record.load(d, "valid")
    ts = record.load(recorded, "valid")
    kept = np.flatnonzero(~LB.could_reject(ts.traces.columns, True))
    assert kept.size and (crit[kept] == LB.UNLABELED).all()       # as recorded
    for label in (0, 1):
        bad = crit.copy()
        bad[kept[1]] = label
        D.write_npz(d / "valid.labels.npz", meta, {"critical.npy": bad})
        with pytest.raises(DataError, match=f"field 'critical' row {kept[1]}: a label for a "
                                            "draft the standard rule never rejects"):
            record.load(d, "valid")


# ------------------------------------------------------------ the objectives

# a rule that reads inputs of every kind, so a column out of place changes it
PROBE = "pmin(1.0, add(mul(p_max, slot_tv), mul(0.1, add(block_position, q_max))))"


def _probe_by_name(c: dict) -> np.ndarray:
    from evolve.data.decode import slot_columns
    slots = slot_columns(c)
    return np.minimum(1.0, c["p_max"] * slots["slot_tv"]
                      + 0.1 * (c["block_position"] + c["q_max"]))


def _slow_sums(h, c, critical, g, greedy):
    """Per block, by loops: the expected tokens, and the accepted critical and harmless
    extras beyond the standard rule."""
    a_rule = np.clip(np.nan_to_num(h, nan=0.0), 0.0, 1.0)
    tokens = crit = harmless = 0.0
    n = len(h)
    for b in range(n // g):
        reach = 1.0
        for j in range(b * g, b * g + g):
            if greedy:
                s = 1.0 if c["token"][j] == c["target_top"][j] else 0.0
                a = 1.0 if s == 1.0 else a_rule[j]
            else:
                s = min(1.0, c["target_prob"][j] / c["draft_prob"][j])
                a = a_rule[j] if c["draft_cand"][j] >= 0 else s
            extra = reach * max(a - s, 0.0)
            crit += extra * (critical[j] == 1)
            harmless += extra * (critical[j] == 0)
            reach *= a
            tokens += reach
        tokens += 1.0
    return tokens / (n // g), crit, harmless


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_task_objectives_equal_a_slow_reference_reading_inputs_by_name(mode, recorded,
                                                                       sampled):
    ts = record.load(recorded if mode == "greedy" else sampled, "valid")
    c, g = ts.traces.columns, int(ts.meta["block_size"])
    td = TaskData(ts)
    assert [n for n, row in zip(ALL_INPUT_NAMES, td.X) if not np.isnan(row).all()] == \
        [n for n in ALL_INPUT_NAMES if BY_NAME[n].group in TO.GROUPS]
    m = OBJECTIVES["task_speed"].metrics(treeio.parse(PROBE), {"valid": ts}, {})["valid"]
    tpc, crit, harmless = _slow_sums(_probe_by_name(c), c, ts.critical, g, mode == "greedy")
    answers = np.unique(c["sequence"]).size
    assert m["tokens_per_call"] == pytest.approx(tpc, rel=1e-12)
    assert m["critical_per_answer"] == pytest.approx(crit / answers, rel=1e-12, abs=1e-15)
    assert crit > 0 and harmless > 0


def test_a_population_s_sums_are_the_same_bits_for_any_chunk_of_rows(sampled):
    """A split is scored a chunk of blocks at a time (bounded memory for any population
    and split) and the chunks' fixed-point sums added: any chunking gives the whole
    split's sums, bit for bit."""
    from evolve.lang.randtrees import random_trees
    td = TaskData(record.load(sampled, "valid"))
    progs = treeio.linearise(random_trees(12, seed=4, trace=True)
                             + [treeio.parse(PROBE)])
    whole = td.sums(progs, chunk_blocks=td.n_blocks)
    assert np.isfinite(whole).all() and len(np.unique(whole[:, 1])) > 3
    for chunk in (1, 7, None):
        np.testing.assert_array_equal(td.sums(progs, chunk_blocks=chunk), whole)


def test_the_greedy_form_of_a_family_has_no_sampling_ratio():
    for name in ("kl_judge", "fuzzy_sd", "cactus"):
        assert RATIO in RULES[name].tree(1.0)
        assert RATIO not in RULES[name].task_tree(1.0, greedy=True)
        assert RULES[name].task_tree(1.0, greedy=False) == RULES[name].tree(1.0)


# ------------------------------------------------------------ free-running

def test_lossless_greedy_speculative_decoding_is_the_target_s_greedy_text(pair):
    raw = TC.run_rule(pair, None, "test", None, greedy=True)
    H, _ = TP.prompts_of(pair, "test")
    texts, _ = GR.generate(pair.target, H, record.max_new_of(pair, "test"))
    answers = [record.CHECKER.extract(t.decode("latin-1")) for t in texts]
    assert raw["answers"] == answers
    assert raw["correct"].mean() >= 0.9
    assert (raw["tokens"] / raw["calls"]).mean() > 1.0


@pytest.mark.parametrize("greedy", [True, False])
def test_a_rule_between_is_the_standard_rule_at_0_and_the_rule_at_1(pair, greedy):
    rule = named_rule("kl_judge", 5.0, greedy)[0]
    lossless = TC.run_rule(pair, None, "valid", 12, greedy)
    full = TC.run_rule(pair, rule, "valid", 12, greedy)
    at0 = TC.run_rule(pair, TC.between(rule, 0.0, greedy), "valid", 12, greedy)
    at1 = TC.run_rule(pair, TC.between(rule, 1.0, greedy), "valid", 12, greedy)
    for k in ("tokens", "calls"):
        np.testing.assert_array_equal(at0[k], lossless[k])
        np.testing.assert_array_equal(at1[k], full[k])
    assert not np.array_equal(full["calls"], lossless["calls"])


def test_tuning_keeps_the_fewest_calls_per_correct_answer_within_the_budget_and_bisects(
        monkeypatch):
    """A fake decoder: the param p takes 20 / (2 + p) target calls for the same 20 tokens
    and loses p / 10 of the answers (so a budget of 0.03 allows p <= 0.3); calls per
    correct answer fall with p inside the budget. A param that takes fewer calls but
    changes more answers than the agreement budget allows is refused too."""
    n = 100
    ref = {"correct": np.ones(n, bool), "tokens": np.full(n, 20.0), "calls": np.full(n, 10.0),
           "answers": ["a"] * n}

    def fake(pair, p, split, prompts, greedy):
        wrong = int(np.ceil(100 * p / 10 - 1e-9))
        return {"correct": np.arange(n) >= wrong, "tokens": np.full(n, 20.0),
                "calls": np.full(n, 20.0 / (2.0 + p)),
                "answers": ["b"] * wrong + ["a"] * (n - wrong)}

    monkeypatch.setattr(TC, "run_rule", fake)
    out = TC.tune(None, lambda p: p, [0.0, 0.2, 0.5, 0.8], 0.03, ref, lenient=False)
    assert out["param"] == 0.2 and out["drop"] == pytest.approx(0.02)
    assert out["summary"]["calls_per_correct"] == pytest.approx(20.0 / 2.2 / 0.98)
    out = TC.tune(None, lambda p: p, [0.0, 0.2, 0.5, 0.8], 0.03, ref, bisect_steps=6)
    assert 0.2 < out["param"] <= 0.3 and out["drop"] <= 0.03 + 1e-12
    assert out["summary"]["tokens_per_call"] == pytest.approx(2.0 + out["param"])
    assert TC.tune(None, lambda p: p, [0.5, 0.8], 0.03, ref)["param"] is None
    out = TC.tune(None, lambda p: p, [0.0, 0.2, 0.5, 0.8], 0.03, ref, lenient=False,
                  agreement_budget=0.01)        # p = 0.2 changes 2 answers of 100
    assert out["param"] == 0.0


# ------------------------------------------------------------ the learned judge

def test_the_judge_learns_the_labels_and_decides_free_running_as_offline(recorded):
    td = TaskData(record.load(recorded, "train"))
    model = judge.fit(td)
    labelled = td.arrays.critical >= 0
    p = model.probability(td.X[judge.ROWS])[labelled]
    y = td.arrays.critical[labelled] == 1
    assert p[y].mean() > p[~y].mean() + 0.05          # it ranks critical drafts higher
    lam = float(np.quantile(p, 0.5))
    feats = {name: td.X[i] for i, name in enumerate(SLOT_SIGNATURE)}
    for greedy in (True, False):
        td.greedy = greedy
        offline = judge.thresholds(model, td, lam)
        np.testing.assert_array_equal(judge.rule(model, lam, greedy).many(feats), offline)
        assert set(np.unique(offline[(model.probability(td.X[judge.ROWS]) < lam)])) == {1.0}
    td.greedy = True                                # as recorded
    lam0, row = judge.tune(model, td, 0.0)          # the standard rule fits any budget
    assert metrics_of(row)["critical_per_answer"] == 0.0


# ------------------------------------------------------------ the TV bound

def test_past_the_standard_rule_each_unit_of_acceptance_costs_a_unit_of_tv():
    """For any p, q, acceptance a in [0, 1] and residual r, the emitted e = q a +
    (1 - A) r has TV(e, p) >= A - (1 - TV(p, q)), A = sum q a; the standard rule
    with its residual has A = 1 - TV(p, q) and e = p."""
    rng = np.random.default_rng(0)
    worst = np.inf
    for _ in range(20000):
        V = int(rng.integers(2, 9))
        p, q, r = (rng.dirichlet(np.full(V, rng.choice([0.2, 1.0, 5.0]))) for _ in range(3))
        a = rng.random(V) ** rng.choice([0.3, 1.0, 3.0])
        if rng.random() < 0.3:
            a = np.minimum(1.0, a + np.minimum(1.0, p / q))        # above the standard rule
        A = (q * a).sum()
        e = q * a + (1 - A) * r
        tv = 0.5 * np.abs(e - p).sum()
        bound = A - (1 - 0.5 * np.abs(p - q).sum())
        worst = min(worst, tv - bound)
    assert worst >= -1e-12
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    a = np.minimum(1.0, p / q)
    A = (q * a).sum()
    resid = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
    assert A == pytest.approx(1 - 0.5 * np.abs(p - q).sum())
    np.testing.assert_allclose(q * a + (1 - A) * resid, p, atol=1e-12)
    for _ in range(1000):               # a lenient rule with that residual: the bound, exactly
        p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
        a = np.minimum(1.0, p / (rng.uniform(0.05, 1.0) * q))
        A, tv_pq = (q * a).sum(), 0.5 * np.abs(p - q).sum()
        resid = np.maximum(p - q, 0) / np.maximum(p - q, 0).sum()
        e = q * a + (1 - A) * resid
        assert 0.5 * np.abs(e - p).sum() == pytest.approx(A - (1 - tv_pq), abs=1e-12)


# ------------------------------------------------------------ the commands

def _readme_task_commands() -> list[list[str]]:
    """The README's task-world commands, each as its words after ``evolve``."""
    import re
    import shlex
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("\n## Tasks with checked answers\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    cmds = [shlex.split(line, comments=True) for line in block.splitlines()]
    assert all(c[0] == "evolve" for c in cmds if c)
    return [c[1:] for c in cmds if c]


@pytest.mark.slow
def test_record_run_and_compare_from_the_command_line(tmp_path, monkeypatch):
    """The README's task-world commands as written (in an empty directory), then what
    they made, and the refusals around them."""
    from evolve.io import paths
    monkeypatch.chdir(tmp_path)           # the checkout's datasets/ and runs/ stay untouched
    monkeypatch.setattr(paths, "DATA_DIR", tmp_path / "datasets")
    monkeypatch.setenv("EVOLVE_RUNS_DIR", str(tmp_path / "runs"))
    record_cmd, run_cmd, compare_cmd = _readme_task_commands()
    assert record_cmd[:2] == ["data", "task"] and run_cmd[0] == "run"
    assert compare_cmd[0] == "simulate-task"
    r = invoke(*record_cmd)
    assert r.exit_code == 0, r.output
    data = tmp_path / "datasets" / "task"
    r = invoke("data", "task", "--out", data, "--train-prompts", 40)
    one_line_error(r, "--out", "exists", "--force")
    runs = tmp_path / "runs"
    r = invoke(*run_cmd)
    assert r.exit_code == 0, r.output
    name = run_cmd[run_cmd.index("--name") + 1]
    ch = json.loads((runs / name / "champion.json").read_text())
    assert ch["critical_budget"] == float(run_cmd[run_cmd.index("--budget-critical") + 1])
    assert ch["standing"]["verdict"] in ("wins", "loses", "infeasible")
    assert "learned_judge" in ch["baselines_tuned_on_valid"]
    r = invoke("inspect", name)
    assert r.exit_code == 0, r.output
    assert ch["scope"]["decoding"] == "greedy" and "greedy decoding" in r.output
    r = invoke("export", name, "--format", "numpy", "--allow-infeasible")
    assert r.exit_code == 0, r.output
    assert "DECODING = 'greedy'" in r.stdout
    one_line_error(invoke("export", name, "--format", "hf", "--allow-infeasible"),
                   "--format hf", "greedy decoding")
    r = invoke(*compare_cmd)
    assert r.exit_code == 0, r.output
    assert "trtllm" in r.output and "lossless" in r.output
    # TensorRT-LLM's rule with the engine's own settings, as they are set there
    assert ("trtllm_relaxed(delta=0.2) in the engine: tensorrt-llm: relaxed_topk=256, "
            "relaxed_delta=0.2") in r.output
    r = invoke(*compare_cmd, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert set(doc["rules"]) == {"lossless", f"run {name}", "trtllm_relaxed(delta=0.2)"}, doc["rules"]
    assert doc["problems"] == 16 and doc["decoding"] == "greedy"
    assert doc["engine_settings"] == {
        "trtllm_relaxed(delta=0.2)": "tensorrt-llm: relaxed_topk=256, relaxed_delta=0.2"}
    for v in doc["versus_reference"].values():
        lo, hi = v["accuracy"]["ci95"]
        assert lo <= v["accuracy"]["difference"] <= hi
    r = invoke("simulate-task", "--data", data, "--compare", "lossless", "--prompts", 17)
    one_line_error(r, "--prompts", "17", "16 problems")


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_a_greedy_champion_exports_with_the_acceptance_it_was_scored_with(recorded, sampled,
                                                                          tmp_path, lib):
    """A task champion records its scope with the decoding. Greedy: the numpy and torch
    exports and ``evolve.Rule`` give every recorded row the task objectives' acceptance
    (1 for a target-argmax draft, the clipped threshold for every other), which the
    rule's bare threshold is not; the engine formats refuse it in one line. Sampled:
    the usual trace scope."""
    import importlib.util

    import evolve
    from evolve.data import traces
    from evolve.export import modules
    from evolve.kernels.tokens import matrix_thresholds
    from evolve.runs.schema import check_scope
    tree = "mul(0.6, target_prob)"
    split = record.load(recorded, "valid")
    scope = check_scope(traces.scope_of(split.meta), "scope")
    assert scope["decoding"] == "greedy" and scope["top_k"] is None
    assert traces.scope_of(record.load(sampled, "valid").meta)["decoding"] == "sample"
    td = TaskData(split)
    h = matrix_thresholds(treeio.linearise([treeio.parse(tree)]), td.X)[0]
    clip = np.where(h > 0, np.where(h > 1, 1.0, h), 0.0)
    want = np.where(td.arrays.inside, clip, td.arrays.outside)     # the objectives' a
    assert (want != clip).mean() > 0.2          # the argmax drafts make a difference
    meta = {"metrics": {}, "scope": scope}
    path = tmp_path / f"greedy_{lib}.py"
    path.write_text(modules.export_source(treeio.parse(tree), lib, meta, "t"))
    spec = importlib.util.spec_from_file_location(f"greedy_{lib}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = split.traces.columns
    conv = np.asarray if lib == "numpy" else __import__("torch").as_tensor
    args = [conv(np.asarray(c[n], dtype=bool if n == "top_token_match" else np.float64))
            for n in mod.INPUTS]
    np.testing.assert_allclose(np.asarray(mod.acceptance(0, *args)), want, rtol=0, atol=1e-12)
    rule = evolve.Rule(tree, scope=scope)
    feats = {n: c[n] for n in (*rule.inputs, "top_token_match")}
    np.testing.assert_allclose(rule.acceptance(feats), want, rtol=0, atol=1e-12)
    for fmt in ("hf", "vllm", "vllm-patch"):
        with pytest.raises(modules.ExportError, match="greedy decoding"):
            evolve.export(rule, format=fmt)


def test_simulate_task_refuses_data_that_is_not_a_task(tmp_path, recorded):
    r = invoke("simulate-task", "--data", tmp_path, "--compare", "lossless")
    one_line_error(r, "test.npz")
    r = invoke("simulate-task", "--data", recorded, "--compare", "nosuch:1")
    one_line_error(r, "--compare", "nosuch")


def test_simulate_task_refuses_an_unknown_decoding(recorded, tmp_path, monkeypatch):
    """A task meta of another decoding ("beam") used to be decoded as sampling."""
    from evolve.data import traces
    ts = traces.load(recorded / "test.npz", name="test")
    traces.save(traces.TraceSplit(ts.columns, {**ts.meta, "decoding": "beam"}, "test"),
                tmp_path / "test.npz")
    monkeypatch.setattr(TC, "compare", lambda *a, **k: pytest.fail("decoded"))
    r = invoke("simulate-task", "--data", tmp_path, "--compare", "lossless")
    one_line_error(r, "test.npz", "decoding", "'beam'", "greedy or sample")


@pytest.mark.parametrize("args,needles", [
    (("--train-prompts", 0), ("--train-prompts", "0")),      # was taken as the default
    (("--test-prompts", 0), ("--test-prompts", "0")),
    (("--out", "FILE/sub"), ("--out", "FILE", "not a directory")),
    (("--out", "FILE"), ("--out", "FILE", "not a directory")),
])
def test_data_task_refuses_before_any_work(tmp_path, monkeypatch, args, needles):
    """Options are checked, and --out is checked writable, before the pair is built
    and before any split is recorded (an unusable --out used to be found only when the
    recorded splits were written)."""
    monkeypatch.setattr(TP, "build_pair", lambda *a, **k: pytest.fail("the pair was built"))
    monkeypatch.setattr(record, "record_split", lambda *a, **k: pytest.fail("recorded"))
    (tmp_path / "FILE").write_text("a file")
    args = [str(tmp_path / a) if isinstance(a, str) and a.startswith("FILE") else a
            for a in args]
    if "--out" not in args:
        args += ["--out", tmp_path / "out"]
    one_line_error(invoke("data", "task", *args),
                   *[str(tmp_path / n) if n == "FILE" else n for n in needles])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


def test_a_task_run_on_a_device_or_a_cluster_without_shards_is_refused_in_one_line(recorded, tmp_path):
    pytest.importorskip("torch")
    r = invoke("run", "--objective", "task_speed", "--data", recorded, "--generations", 1,
               "--population", 10, "--device", "cuda", "--runs-dir", tmp_path,
               env={"EVOLVE_TORCH_DEVICE": "cpu"})
    one_line_error(r, "device", "task traces are scored on the CPU")
    r = invoke("run", "--objective", "task_speed", "--data", recorded, "--generations", 1,
               "--population", 10, "--cluster", "local:1", "--runs-dir", tmp_path)
    one_line_error(r, "--cluster", "needs sharded traces", "evolve data shard")
    assert not any(tmp_path.iterdir())
