"""The Python API beyond runs (``evolve.api``): ``evolve.Rule``, ``evolve.tradeoff``,
``evolve.compare``, ``evolve.trace`` and ``evolve.export``, each the same front door the
command line goes through (same defaults, same one-line errors naming the parameter
where the command line names its option), with results as plain records.

Also guarantee 25 of docs/reliability.md, Configuration from any caller
(test_tradeoff_refuses_bad_arguments_in_one_line): see tests/test_hostile_config.py.
"""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest

import evolve
from evolve.errors import EvolveError
from tests import tracekit
from tests.clikit import SCOPE, fake_trace_run, invoke, isolated, one_line_error  # noqa: F401

pytestmark = pytest.mark.usefixtures("isolated")
tiny_dir = tracekit.tiny_dir_fixture()

LENIENT = "pmin(1.0, pdiv(target_prob, mul(0.8, draft_prob)))"
SLOT = "pmin(1.0, add(pdiv(target_prob, draft_prob), mul(0.5, slot_tv)))"


def _exported(rule, fmt):
    """The module `evolve export --format fmt` writes for ``rule``, loaded here."""
    import types
    mod = types.ModuleType(f"exported_{fmt}")
    exec(compile(rule.source(fmt), f"<export {fmt}>", "exec"), mod.__dict__)
    return mod


def _features(n=500, seed=0):
    rng = np.random.default_rng(seed)
    q, p = rng.uniform(1e-4, 1, n), rng.uniform(1e-4, 1, n)
    return {"draft_prob": q, "target_prob": p, "position": rng.integers(0, 50, n),
            "draft_entropy": rng.uniform(0, 3, n), "target_entropy": rng.uniform(0, 3, n),
            "top_token_match": rng.random(n) < 0.5, "block_position": rng.integers(0, 4, n),
            "p_max": np.maximum(p, rng.uniform(0, 1, n)),
            "q_max": np.maximum(q, rng.uniform(0, 1, n)), "slot_tv": rng.uniform(0, 1, n),
            "slot_kl_pq": rng.uniform(0, 2, n), "slot_kl_qp": rng.uniform(0, 2, n)}


# ------------------------------------------------------------------------ Rule

def test_import_evolve_loads_nothing_heavy():
    code = ("import sys, evolve; evolve.__version__; "
            "print(sorted(m for m in ('numba', 'numpy', 'deap', 'sympy', 'torch') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


def test_a_rule_reads_like_a_formula_and_thresholds_like_its_export():
    rule = evolve.Rule(LENIENT)
    assert str(rule) == "min(1, (t / (0.8 * d)))" and rule.inputs == ("draft_prob",
                                                                        "target_prob")
    F = _features()
    h = rule.threshold(F)
    assert np.array_equal(h, np.minimum(1.0, F["target_prob"] / (0.8 * F["draft_prob"])))
    assert np.array_equal(rule.threshold(draft_prob=F["draft_prob"],
                                         target_prob=F["target_prob"]), h)
    exported = _exported(rule, "numpy")          # the module `evolve export` writes
    args = [F[n] for n in exported.INPUTS]
    assert np.allclose(exported.threshold(*args), h, rtol=0, atol=1e-15)
    here = rule.numpy()                          # its interface, evaluated here
    assert here.INPUTS == exported.INPUTS and np.array_equal(here.threshold(*args), h)
    import sympy
    t, d = sympy.Symbol("t", real=True), sympy.Symbol("d", real=True)
    assert sympy.simplify(rule.sympy() - sympy.Min(1, t / (0.8 * d))) == 0
    assert "def threshold(" in rule.source("torch") and "import torch" in rule.source("torch")
    assert evolve.Rule(rule.tree) == rule


def test_a_scoped_rule_decides_as_its_exports_do():
    """Scored on the draft's top 16: the rule inside, the standard rule for drafts ranked
    16 or later; without the ranks it refuses, as the exported module does."""
    rule = evolve.Rule(SLOT, scope=dict(SCOPE, top_k=16))
    F = _features()
    rank = np.random.default_rng(1).integers(0, 40, len(F["draft_prob"]))
    a = rule.acceptance(F, draft_rank=rank)
    mod = _exported(rule, "numpy")
    want = mod.acceptance(rank, *[F[n] for n in mod.INPUTS])
    assert np.allclose(a, want, rtol=0, atol=1e-15)
    here = rule.numpy()
    assert here.TOP_K == mod.TOP_K == 16 and here.SCOPE == mod.SCOPE
    assert np.array_equal(here.acceptance(rank, *[F[n] for n in here.INPUTS]), a)
    std = np.minimum(1.0, F["target_prob"] / F["draft_prob"])
    assert np.array_equal(a[rank >= 16], std[rank >= 16])
    assert not np.array_equal(a[rank < 16], std[rank < 16])
    with pytest.raises(EvolveError) as e:
        rule.acceptance(F)
    assert e.value.param == "draft_rank" and "top 16" in str(e.value)
    with pytest.raises(ValueError, match="draft_rank"):
        mod.accept(np.zeros(3), *[F[n][:3] for n in mod.INPUTS])
    u = np.random.default_rng(2).random(len(rank))
    assert np.array_equal(rule.accept(u, F, draft_rank=rank), u < a)
    q = np.random.default_rng(3).dirichlet(np.ones(30), size=5)
    tok = np.array([0, 3, 7, 29, 12])
    assert np.array_equal(evolve.Rule.draft_rank(q, tok), mod.draft_rank(q, tok))


def test_a_rule_without_scope_decides_every_token():
    rule = evolve.Rule(LENIENT)
    F = _features()
    assert np.array_equal(rule.acceptance(F), np.clip(rule.threshold(F), 0, 1))


def test_rule_errors_are_one_line_naming_the_parameter():
    for make, param in ((lambda: evolve.Rule(LENIENT).threshold({"draft_prob": [0.5]}),
                         "features"),
                        (lambda: evolve.Rule(42), "tree"),
                        (lambda: evolve.Rule.installed("nope"), "kind")):
        with pytest.raises(EvolveError) as e:
            make()
        assert e.value.param == param and "\n" not in str(e.value), str(e.value)
    with pytest.raises(EvolveError, match="unknown primitive|unknown|not"):
        evolve.Rule("pmin(1.0, nope(target_prob))")
    with pytest.raises(EvolveError, match="scope.top_k"):
        evolve.Rule(LENIENT, scope=dict(SCOPE, top_k=1000))


def test_a_run_champion_is_a_rule_with_its_scope_and_metrics(tmp_path):
    fake_trace_run(tmp_path, "r1", SLOT, scope=dict(SCOPE, top_k=16))
    rule = evolve.Rule.from_run(tmp_path / "r1")
    back = evolve.load_run(tmp_path / "r1")
    assert rule == back.rule and rule.scope["top_k"] == 16
    assert rule.metrics["test"]["tokens_per_call"] == 2.5
    assert rule.name == "run r1" and "SCOPE = {" in rule.source("numpy")
    torch = pytest.importorskip("torch")
    F = _features(50)
    rank = np.arange(50) % 20
    want = rule.acceptance(F, draft_rank=rank)
    for mod in (rule.torch(), _exported(rule, "torch")):      # here, and as exported
        got = mod.acceptance(torch.as_tensor(rank),
                             *[torch.as_tensor(F[n]) for n in mod.INPUTS])
        assert np.allclose(got.numpy(), want, rtol=0, atol=1e-12), mod
    t = rule.torch()
    u = torch.rand(50, dtype=torch.float64)
    assert torch.equal(t.accept(u, *[torch.as_tensor(F[n]) for n in t.INPUTS],
                                draft_rank=torch.as_tensor(rank)),
                       u < torch.as_tensor(want))


def test_latex_keeps_the_protected_operators_as_named_functions():
    """pdiv, plog and pexp differ from /, log and exp at the edges: the LaTeX names them
    (sympy would read plog(pexp(t)) / d as t / d); the plain operators are sympy's own."""
    rule = evolve.Rule("pmin(1.0, pdiv(plog(pexp(target_prob)), psqrt(draft_prob)))")
    tex = rule.latex()
    for name in ("pdiv", "plog", "pexp"):
        assert rf"\operatorname{{{name}}}" in tex, tex
    assert r"\min" in tex and r"\sqrt{\left|{d}\right|}" in tex, tex
    assert str(rule.sympy()) == "Min(1, t/sqrt(Abs(d)))"       # the plain reading


def test_a_run_s_hall_of_fame_is_a_table_in_memory(tmp_path):
    """``load_run(...).hall_of_fame``: one flat record per hall_of_fame.json entry, with
    a trace run's valid tokens per call and TV from pareto.json, the champion's row marked
    with its verdict; a damaged file is one RunError line naming it."""
    champ = "pmin(1.0, pdiv(target_prob, mul(0.8, draft_prob)))"
    other = "pmin(1.0, pdiv(target_prob, draft_prob))"
    path = fake_trace_run(tmp_path, "hof", champ, standing={"verdict": "loses", "why": "x"})
    (path / "hall_of_fame.json").write_text(json.dumps([
        {"tree": t, "expression": str(evolve.Rule(t)), "size": n, "born": g,
         "train_fitness": f, "valid_fitness": f - 0.01}
        for t, n, g, f in ((champ, 7, 3, 2.4), (other, 5, 0, 2.3))]))
    (path / "pareto.json").write_text(json.dumps({
        "split": "valid", "budget": 0.03, "series": {}, "baselines": [],
        "hall_of_fame": [{"tree": other, "expression": "", "tokens_per_call": 2.25,
                          "tv_per_token": 0.0}, {"tree": champ, "expression": "",
                                                 "tokens_per_call": 2.39,
                                                 "tv_per_token": 0.029}]}))
    rows = evolve.load_run(path).hall_of_fame
    assert rows == [
        {"formula": "min(1, (t / (0.8 * d)))", "tree": champ, "size": 7, "generation": 3,
         "train_fitness": 2.4, "valid_fitness": 2.39, "valid_tokens_per_call": 2.39,
         "valid_tv_per_token": 0.029, "champion": True, "standing": "loses"},
        {"formula": "min(1, (t / d))", "tree": other, "size": 5, "generation": 0,
         "train_fitness": 2.3, "valid_fitness": 2.29, "valid_tokens_per_call": 2.25,
         "valid_tv_per_token": 0.0, "champion": False, "standing": None}]
    (path / "hall_of_fame.json").write_text(json.dumps([{"tree": champ, "size": "7"}]))
    with pytest.raises(EvolveError) as e:
        evolve.load_run(path)
    assert "hall_of_fame.json" in str(e.value) and "\n" not in str(e.value)


def test_named_rules_come_from_the_table():
    rule = evolve.Rule.named("leniency", 0.8)
    assert rule.name == "leniency(l=0.8)"
    F = _features()
    assert np.allclose(rule.threshold(F), evolve.Rule(LENIENT).threshold(F), atol=1e-15)


# -------------------------------------------------------------------- tradeoff

def test_tradeoff_is_what_the_command_prints(tiny_dir, tmp_path):
    t = evolve.tradeoff(tiny_dir, budgets=[0.02])
    cli = json.loads(invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--json").stdout)
    strip = {k: v for k, v in t.report.items() if k != "seconds"}
    assert {k: v for k, v in cli.items() if k != "seconds"} == json.loads(
        json.dumps(strip))
    assert t.budgets == [0.02]
    rows = t.rows
    assert {r["rule"] for r in rows} >= {"standard_rejection", "leniency", "knapsack_oracle"}
    assert all(set(r) >= {"budget", "rule", "test_tokens_per_call", "why"} for r in rows)
    best = t.best(0.02)
    assert best["kind"] != "oracle" and best["valid_tv_per_token"] <= 0.02
    assert best["test_tokens_per_call"] == max(r["test_tokens_per_call"] for r in rows
                                               if r["fits_valid"] and r["kind"] != "oracle")
    # every row says whether and how it is deployed; a rule's row exports as it was scored
    by = {r["rule"]: r for r in rows}
    assert by["knapsack_oracle"]["exportable"] is False and by["knapsack_oracle"]["tree"] is None
    assert by["hf_ensemble"]["export"].startswith("transformers setting, no patch: ")
    lenient = by["leniency"]
    assert lenient["exportable"] and lenient["export"].startswith(
        "evolve.export(t.rule(0.02, 'leniency'), format=...): numpy, torch, hf, vllm")
    from evolve.rules.table import RULES
    rule = t.rule(0.02, "leniency")
    assert rule.tree == lenient["tree"] == RULES["leniency"].tree(lenient["param"])
    assert rule.scope == t.report["scope"] and rule.scope["top_k"] == 16
    assert "def threshold(" in evolve.export(rule, format="numpy").source
    for name in ("knapsack_oracle", "hf_ensemble"):
        with pytest.raises(EvolveError) as e:
            t.rule(0.02, name)
        assert e.value.param == "name" and "\n" not in str(e.value)
    assert all(isinstance(r["exportable"], bool) and r["export"] for r in rows)


def test_tradeoff_of_an_engine_sweeps_its_knobs_and_standard_rejection(tiny_dir):
    seen = []
    t = evolve.tradeoff(tiny_dir, budgets=0.03, engine="transformers", progress=seen.append)
    assert set(t.series) == {"hf_ensemble", "standard_rejection"}
    assert {r["rule"] for r in t.rows} == {"hf_ensemble", "standard_rejection",
                                           "knapsack_oracle"}
    assert any("sweeping 2 rule families" in s for s in seen)


def test_tradeoff_of_named_families_tunes_those_and_standard_rejection(tiny_dir):
    """``families`` (``--family``): those rule families and the reference, the same rows
    as the whole table gives them."""
    t = evolve.tradeoff(tiny_dir, budgets=0.03, families=["fuzzy_sd", "leniency"])
    assert set(t.series) == {"fuzzy_sd", "leniency", "standard_rejection"}
    whole = evolve.tradeoff(tiny_dir, budgets=0.03)
    for name in ("fuzzy_sd", "leniency", "standard_rejection"):
        (mine,) = [r for r in t.rows if r["rule"] == name]
        (same,) = [r for r in whole.rows if r["rule"] == name]
        assert mine == same
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.03, "--family", "leniency",
               "--json")
    assert r.exit_code == 0, r.output
    assert {x["rule"] for x in json.loads(r.stdout)["budgets"][0]["rows"]} >= {"leniency"}
    assert set(json.loads(r.stdout)["series"]) == {"leniency", "standard_rejection"}
    one_line_error(invoke("tradeoff", "--data", tiny_dir, "--family", "no_such_rule"),
                   "no_such_rule", "fuzzy_sd")


@pytest.mark.parametrize("kwargs, param", [
    ({"budgets": ["0.01"]}, "budgets"), ({"budgets": [-1]}, "budgets"),
    ({"budgets": [float("nan")]}, "budgets"), ({"budgets": []}, "budgets"),
    ({"engine": "vllm"}, "engine"), ({"trajectory": "yes"}, "trajectory"),
    ({"device": "tpu"}, None), ({"png": ""}, "png"), ({"runs": ["no-such-run"]}, None),
    ({"families": ["no_such_rule"]}, "families"), ({"families": []}, "families"),
])
def test_tradeoff_refuses_bad_arguments_in_one_line(tiny_dir, tmp_path, kwargs, param):
    with pytest.raises(EvolveError) as e:
        evolve.tradeoff(tiny_dir, runs_dir=tmp_path, **kwargs)
    assert "\n" not in str(e.value)
    if param is not None:
        assert e.value.param == param, str(e.value)


# --------------------------------------------------------------------- compare

def test_compare_takes_names_and_rules_and_gives_paired_records(tiny_dir):
    ref = evolve.Rule.named("standard_rejection")
    c = evolve.compare([ref, "leniency:0.8", evolve.Rule(LENIENT)], data_dir=tiny_dir,
                       prompts=4, blocks=2)
    assert c.reference == ref.name
    rows = {r["rule"]: r for r in c.rows}
    assert rows[ref.name]["tokens_difference"] is None
    d = rows["leniency(l=0.8)"]
    lo, hi = d["tokens_difference_ci95"]
    assert lo <= d["tokens_difference"] <= hi
    # the table's rule and the same tree by hand decode identically
    assert rows["min(1, (t / (0.8 * d)))"]["tokens_per_call"] == d["tokens_per_call"]
    assert c.difference("leniency(l=0.8)")["tokens_per_call"]["difference"] == \
        d["tokens_difference"]
    # where the distortion falls: by distance from the prompt, none for the standard rule
    assert list(d["tv_by_distance"]) == ["0", "1", "2-3", "4-7", "8-15", "16+"]
    assert d["tv_by_distance"]["0"] > 0.01 and rows[ref.name]["tv_by_distance"]["0"] < 1e-12


@pytest.mark.parametrize("kwargs, param", [
    ({"rules": ["standard_rejection"]}, "rules"), ({"rules": "leniency"}, "rules"),
    ({"rules": ["standard_rejection", "nope"]}, "rules"), ({"split": "dev"}, "split"),
    ({"prompts": 1}, "prompts"), ({"blocks": 0}, "blocks"), ({"seed": -1}, "seed"),
    ({"rules": ["standard_rejection", 3]}, "rules"),
])
def test_compare_refuses_bad_arguments_in_one_line(tiny_dir, kwargs, param):
    args = {"rules": ["standard_rejection", "leniency:0.8"], "data_dir": tiny_dir, **kwargs}
    with pytest.raises(EvolveError) as e:
        evolve.compare(**args)
    assert e.value.param == param and "\n" not in str(e.value), str(e.value)


def test_compare_on_a_missing_directory_names_the_command_that_records_traces(tmp_path):
    with pytest.raises(EvolveError) as e:
        evolve.compare(["standard_rejection", "leniency:0.8"], data_dir=tmp_path / "none")
    assert "trace directory not found" in str(e.value) and "evolve data trace" in str(e.value)
    r = invoke("simulate", "--data", tmp_path / "none", "--compare", "standard_rejection",
               "--compare", "leniency:0.8")
    one_line_error(r, "trace directory not found", "`evolve data trace`")


# ----------------------------------------------------------------------- trace

def test_trace_records_the_splits_the_command_records(tmp_path):
    opts = {f.name: getattr(tracekit.TINY, f.name)
            for f in dataclasses.fields(tracekit.TINY)}
    res = evolve.trace(tmp_path / "t", **opts)
    assert res.rows == {s: len(tracekit.split(s)) for s in ("train", "valid", "test")}
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["test.npz", "train.npz",
                                                                   "valid.npz"]
    again = evolve.trace(tmp_path / "t", **opts)          # the same: nothing rewritten
    assert again.files == [] and again.config == res.config


@pytest.mark.parametrize("kwargs, param", [
    ({"block_size": 0}, "block_size"), ({"top_k": 300}, "top_k"),
    ({"max_files": 2}, "max_files"), ({"colour": "red"}, "colour"),
    ({"backend": "nope"}, "backend"), ({"target": "x"}, "target"),
    ({"rows_per_shard": 0}, "rows_per_shard"),
])
def test_trace_refuses_bad_arguments_in_one_line(tmp_path, kwargs, param):
    with pytest.raises(EvolveError) as e:
        evolve.trace(tmp_path / "t", **kwargs)
    assert e.value.param == param and "\n" not in str(e.value), str(e.value)
    assert not (tmp_path / "t").exists()


# ---------------------------------------------------------------------- export

def test_export_of_a_rule_a_run_and_a_file(tmp_path):
    fake_trace_run(tmp_path / "runs", "r1", LENIENT)
    by_name = evolve.export("r1", format="numpy", runs_dir=tmp_path / "runs")
    by_rule = evolve.export(evolve.Rule.from_run(tmp_path / "runs" / "r1"), format="numpy")
    assert "def threshold(" in by_name.source and by_name.path is None
    assert by_rule.source.split("def threshold(")[1] == by_name.source.split(
        "def threshold(")[1]
    out = tmp_path / "rule.py"
    e = evolve.export(tmp_path / "runs" / "r1", format="torch", out=out)
    assert e.path == out and out.read_text() == e.source
    import importlib
    importlib.import_module("evolve.export.modules")
    assert isinstance(evolve.export, type(importlib))     # the name holds the package now
    assert evolve.export("r1", format="numpy", runs_dir=tmp_path / "runs").source == \
        by_name.source


@pytest.mark.parametrize("kwargs, param", [
    ({"format": "tensorflow"}, "format"), ({"installed": "both", "run": None}, "installed"),
    ({"force": True}, "force"), ({"out": ""}, "out"),
])
def test_export_refuses_bad_arguments_in_one_line(tmp_path, kwargs, param):
    fake_trace_run(tmp_path, "r1", LENIENT)
    args = {"run": "r1", "runs_dir": tmp_path, **kwargs}
    with pytest.raises(EvolveError) as e:
        evolve.export(**args)
    assert e.value.param == param and "\n" not in str(e.value), str(e.value)


# ---------------------------------------------------------------- one front door

@pytest.mark.parametrize("args, kwargs, option", [
    (("--resume", "x", "--population", 10), {"resume": "x", "population": 10},
     "--population"),
    (("--engine", "vllm", "--inputs", "draft_prob"), {"engine": "vllm",
                                                       "inputs": "draft_prob"}, "--engine"),
    (("--ess-floor", "0.2"), {"ess_floor": 0.2}, "--ess-floor"),
    (("--tournament", 0), {"tournament": 0}, "--tournament"),
])
def test_run_and_evolve_run_refuse_alike(tmp_path, args, kwargs, option):
    """One rule, one message: the command line's line is the API's with the option
    named instead of the parameter."""
    with pytest.raises(EvolveError) as e:
        evolve.run(runs_dir=tmp_path, **kwargs)
    r = invoke("run", "--runs-dir", tmp_path, *args)
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == f"error: {option}: {e.value.detail}", (r.stderr, str(e.value))
    assert not any(tmp_path.iterdir())


# -------------------------------------------------------------------- feedback

def test_the_tradeoff_tells_every_step_and_ticks_inside_slow_ones():
    """Each family's sweep on each split, its tuning at each budget and the headroom rows
    are steps, told in order; a family scored point by point by the numpy reference
    (hf_ensemble) is told again at each point, so a line can come every few seconds."""
    from evolve.objectives import spec
    from evolve.rules import tuning
    from evolve.rules.table import families
    sas = {s: spec.TraceArrays.from_split(tracekit.split(s)) for s in ("valid", "test")}
    calls = []
    tuning.tradeoff(sas["valid"], sas["test"], [0.02], progress=lambda *a: calls.append(a))
    total = calls[0][1]
    n = len(families())
    # sweeps, tunings, position leniency, oracle, the value gates' fit and tuning
    assert total == 2 * n + n + 2 + 2
    starts = [c for i, c in enumerate(calls) if i == 0 or c[0] != calls[i - 1][0]]
    assert [c[0] for c in starts] == list(range(total))
    whats = [c[2] for c in starts]
    for f in families():
        assert f"sweeping {f} on valid" in whats and f"tuning {f} to TV 0.02 on valid" in whats
    assert "tuning the value gates to TV 0.02 on valid" in whats
    ticks = [c for c in calls if c[2] == "sweeping hf_ensemble on valid"]
    assert len(ticks) > 5


def test_tradeoff_piped_prints_progress_lines(tiny_dir, monkeypatch):
    from evolve.cli import render
    monkeypatch.setattr(render._Meter, "PLAIN_EVERY", 0.0)
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02)
    assert r.exit_code == 0, r.output
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("tradeoff: ")]
    assert any("(sweeping leniency on test)" in ln for ln in lines), r.stderr
    assert any("(tuning ears to TV 0.02 on valid)" in ln for ln in lines), r.stderr


def test_compare_tells_its_progress_inside_each_rule(tiny_dir, monkeypatch):
    """Free-running decoding of one rule takes about 50 s at 8,192 prompts: its batches of
    decoding, log-likelihoods and distortion are counted, so a line comes at least every
    10 s (here after every step)."""
    from evolve.api import progress
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    seen = []
    evolve.compare(["standard_rejection", "leniency:0.8"], data_dir=tiny_dir, prompts=4,
                   blocks=2, progress=seen.append)
    for what in ("decoding", "log-likelihoods", "the emitted tokens' distortion"):
        assert any(s.startswith("leniency(l=0.8): ") and f"({what})" in s for s in seen), seen
    last = [s for s in seen if s.startswith("leniency(l=0.8): ")][-1]
    done, total = last.split(": ")[1].split(" ")[0].split("/")
    assert done == total, last
