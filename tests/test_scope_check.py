"""A champion is evaluated only inside the scope it was scored in (evolve.api.named.in_scope):
every command and API function that tunes, compares or decodes a champion on data refuses
one of another scope (decoding, draft length, top-k, temperature) in one line naming both,
and with the explicit option evaluates it with every row marked."""

import json

import pytest

import evolve
from evolve.api.named import OUTSIDE, ScopeError, in_scope
from evolve.data import traces
from tests import tracekit
from tests.clikit import SCOPE, fake_trace_run, invoke, isolated, one_line_error  # noqa: F401

pytestmark = pytest.mark.usefixtures("isolated")

tiny_dir = tracekit.tiny_dir_fixture()
STANDARD = "pmin(1.0, pdiv(target_prob, draft_prob))"
LENIENT = "pmin(1.0, pdiv(target_prob, mul(0.8, draft_prob)))"
TINY = {**SCOPE, "top_k": 16}                   # the tiny traces' own scope
ELSEWHERE = {**SCOPE, "top_k": 4, "block_size": 8}
QUICK = ("--engine", "transformers")            # a short sweep: one engine's knob


def _runs(tmp_path):
    runs = tmp_path / "runs"
    fake_trace_run(runs, "here", LENIENT, scope=dict(TINY))
    fake_trace_run(runs, "there", LENIENT, scope=dict(ELSEWHERE))
    return runs


def test_the_tiny_traces_have_the_scope_the_tests_assume(tiny_dir):
    sc = traces.scope_of(traces.load(tiny_dir / "valid.npz").meta)
    assert {k: sc[k] for k in traces.SCOPE_MATCH if k in sc} == \
        {k: TINY[k] for k in traces.SCOPE_MATCH if k in TINY}


@pytest.mark.parametrize("change", [
    {"block_size": 8}, {"top_k": 4}, {"top_k": None}, {"temperature": 0.7},
    {"decoding": "greedy", "top_k": None},
])
def test_each_part_of_the_scope_must_match(change):
    data = dict(TINY)
    why = traces.scope_mismatch({**TINY, **change}, data)
    assert why is not None and why.startswith("scored on ") and "the data is" in why
    assert traces.scope_text(data) in why and traces.scope_text({**TINY, **change}) in why
    assert traces.scope_mismatch(dict(TINY), data) is None
    # the pair may differ: a rule over probabilities transfers to another vocabulary/source
    assert traces.scope_mismatch({**TINY, "vocab_size": 49152, "backend": "hf"}, data) is None
    # a champion of token splits has no decoding at all
    assert "token splits" in traces.scope_mismatch(None, data)


def test_in_scope_marks_or_refuses_and_leaves_rules_of_the_table_alone():
    info = {"label": "run x", "scope": dict(ELSEWHERE)}
    with pytest.raises(ScopeError) as e:
        in_scope(None, info, dict(TINY), param="rules")
    assert e.value.param == "rules" and "any_scope=True" in str(e.value)
    assert "--any-scope" in e.value.named("--compare")
    _, marked = in_scope(None, info, dict(TINY), any_scope=True)
    assert marked["label"] == "run x" + OUTSIDE and "g = 8" in marked["outside_scope"]
    plain = {"label": "leniency l=0.9"}            # no scope claimed: anywhere
    assert in_scope(None, plain, dict(TINY))[1] is plain


def test_tradeoff_refuses_a_run_of_another_scope_and_marks_it_when_asked(tiny_dir, tmp_path):
    runs = _runs(tmp_path)
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--run", "there",
               "--runs-dir", runs)
    one_line_error(r, "--run:", "run there", "g = 8", "top-k 4", "g = 4", "top-k 16",
                   "--any-scope")
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--run", "there", "--run",
               "here", "--runs-dir", runs, "--any-scope", "--json", *QUICK)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert "run there" + OUTSIDE in doc["extra"] and "run here" in doc["extra"]
    (there,) = [i for i in doc["runs"] if i["name"] == "there"]
    assert "g = 8" in there["outside_scope"]
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--run", "there",
               "--runs-dir", runs, "--any-scope", *QUICK)
    assert r.exit_code == 0 and "run there" + OUTSIDE in r.stdout, r.output
    with pytest.raises(ScopeError) as e:
        evolve.tradeoff(tiny_dir, budgets=[0.02], runs=["there"], runs_dir=runs)
    assert e.value.param == "runs"


def test_tradeoff_leaves_out_an_installed_rule_of_another_scope(tiny_dir, tmp_path,
                                                                monkeypatch):
    from evolve.api import tradeoffs
    found = {"kind": "installed", "label": "installed * (run w)", "nodes": None,
             "scope": dict(ELSEWHERE)}
    from evolve.lang import treeio
    monkeypatch.setattr(tradeoffs, "installed_rule",
                        lambda: {**found, "nodes": treeio.parse(LENIENT)})
    t = evolve.tradeoff(tiny_dir, budgets=[0.02], engine="transformers")
    assert not any(k.startswith("installed") for k in t.report["extra"])
    assert "g = 8" in t.report["left_out"][0]
    t = evolve.tradeoff(tiny_dir, budgets=[0.02], engine="transformers", any_scope=True)
    assert "installed * (run w)" + OUTSIDE in t.report["extra"]


def test_simulate_compare_and_the_api_refuse_a_run_of_another_scope(tiny_dir, tmp_path):
    runs = _runs(tmp_path)
    r = invoke("simulate", "--data", tiny_dir, "--compare", "standard_rejection",
               "--compare", "run:there", "--runs-dir", runs, "--prompts", 2, "--blocks", 1)
    one_line_error(r, "--compare:", "run there", "g = 8", "--any-scope")
    with pytest.raises(ScopeError) as e:
        evolve.compare(["standard_rejection", "run:there"], data_dir=tiny_dir, runs_dir=runs,
                       prompts=2, blocks=1)
    assert e.value.param == "rules"
    rule = evolve.Rule.from_run(runs / "there")          # a run's Rule keeps its scope
    with pytest.raises(ScopeError):
        evolve.compare(["standard_rejection", rule], data_dir=tiny_dir, prompts=2, blocks=1)
    c = evolve.compare(["standard_rejection", "run:there", "run:here"], data_dir=tiny_dir,
                       runs_dir=runs, prompts=2, blocks=1, any_scope=True)
    labels = [row["rule"] for row in c.rows]
    assert labels == ["standard_rejection", "run there" + OUTSIDE, "run here"]
    assert list(c.report["outside_scope"]) == ["run there" + OUTSIDE]
    r = invoke("simulate", "--data", tiny_dir, "--compare", "standard_rejection",
               "--compare", "run:there", "--runs-dir", runs, "--prompts", 2, "--blocks", 1,
               "--any-scope")
    assert r.exit_code == 0 and "run there" + OUTSIDE in r.stdout, r.output
    assert "evaluated outside its scope" in r.stderr


def test_simulate_of_one_run_refuses_another_scope(tiny_dir, tmp_path):
    runs = _runs(tmp_path)
    r = invoke("simulate", "--data", tiny_dir, "--run", "there", "--runs-dir", runs,
               "--prompts", 2, "--blocks", 1, "--contexts", 2, "--reps", 2)
    one_line_error(r, "--run:", "run there", "g = 8", "--any-scope")


def _run(runs, name, objective, scope=None):
    """A champion of ``objective``'s world with its metrics, scored in ``scope`` (None:
    none recorded, as a token-world champion has)."""
    from evolve.tasks import task_of
    path = fake_trace_run(runs, name, LENIENT, objective=objective)
    doc = json.loads((path / "champion.json").read_text())
    doc.pop("scope")
    if scope is not None:
        doc["scope"] = scope
    doc["metrics"] = {s: {k: 0.5 for k in task_of(objective).metric_keys}
                      for s in ("train", "valid", "test")}
    (path / "champion.json").write_text(json.dumps(doc))
    return path


def _token_run(runs, name="tok"):
    return _run(runs, name, "expected")


def test_a_token_world_champion_is_refused_on_traces(tiny_dir, tmp_path):
    runs = tmp_path / "runs"
    _token_run(runs)
    r = invoke("tradeoff", "--data", tiny_dir, "--budget", 0.02, "--run", "tok",
               "--runs-dir", runs)
    one_line_error(r, "--run:", "token splits")


def test_simulate_task_refuses_champions_of_another_decoding(task_greedy_small, tmp_path):
    runs = tmp_path / "runs"
    sampled_task = traces.scope_of(
        {**traces.read_file_meta(task_greedy_small / "test.npz"), "decoding": "sample"})
    greedy_task = traces.scope_of(traces.read_file_meta(task_greedy_small / "test.npz"))
    fake_trace_run(runs, "sampled", LENIENT, scope=dict(TINY))          # a trace champion
    _run(runs, "greedy", "task_speed", greedy_task)
    _run(runs, "taskbyte", "task_speed", dict(sampled_task, block_size=2))
    _token_run(runs)
    base = ("simulate-task", "--data", task_greedy_small, "--runs-dir", runs, "--prompts", 2,
            "--compare", "lossless")
    one_line_error(invoke(*base, "--compare", "run:sampled"), "--compare:", "run sampled",
                   "sampled at temperature", "greedy at temperature", "--any-scope")
    one_line_error(invoke(*base, "--compare", "run:tok"), "--compare:", "token splits")
    one_line_error(invoke(*base, "--compare", "run:greedy", "--decoding", "sample"),
                   "--compare:", "run greedy", "greedy at", "sampled at")
    one_line_error(invoke(*base, "--compare", "run:taskbyte"), "run taskbyte")
    r = invoke(*base, "--compare", "run:greedy", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["outside_scope"] == []
    r = invoke(*base, "--compare", "run:sampled", "--any-scope", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert "run sampled" + OUTSIDE in doc["rules"] and len(doc["outside_scope"]) == 1
