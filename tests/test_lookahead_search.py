"""The lookahead inputs (next_tv, ahead) in the trace objectives and the search:
the kernel's input rows follow each block's later slots, the search offers them
only when asked (``lookahead``) and where the slot features exist, and a champion
that reads them says its numbers are an estimate.

Also guarantee 32 of docs/reliability.md, The lookahead inputs: one definition, and
never silently absent: see tests/test_lookahead.py.
"""

import json

import numpy as np
import pytest

from evolve.data import traces as T
from evolve.kernels.speculative import population_objectives
from evolve.lang import primitives as P
from evolve.lang import treeio
from evolve.objectives import spec
from evolve.search.config import Config, ConfigError
from evolve.search.engine import Evolution
from tests import tracekit
from tests.test_lookahead import brute_lookahead


def test_the_input_matrix_reads_each_blocks_later_slots():
    ts = tracekit.split("valid")
    sa = spec.TraceArrays.from_split(ts)
    g, k = sa.g, sa.k
    assert sa.X.shape[0] == len(spec.FEATURES) == 16 and not sa.missing
    F = sa.features()
    assert (np.asarray(ts.block_position) == np.tile(np.arange(g), len(ts) // g)).all()
    nxt, ahead = brute_lookahead(np.asarray(ts.slot_tv, dtype=np.float64), g)
    for r in range(0, len(ts), 7):
        assert (F["next_tv"][r] == nxt[r]).all()           # equal for every candidate
        assert F["ahead"][r] == pytest.approx(np.full(k, ahead[r]), rel=1e-13, abs=1e-15)
    # rows of a block's last slot: nothing drafted after it
    last = np.arange(g - 1, len(ts), g)
    assert (F["next_tv"][last] == 0.0).all() and (F["ahead"][last] == 0.0).all()
    # the standard rule ignores them; a rule that reads them is scored (finite)
    progs = treeio.linearise([treeio.parse("pmin(1.0, pdiv(target_prob, draft_prob))"),
                              treeio.parse("add(pmin(1.0, pdiv(target_prob, draft_prob)), "
                                           "mul(0.01, ahead))")])
    std, la = population_objectives(progs, sa, with_kl=False)
    assert np.isfinite(la).all() and la[0] > std[0]


def test_blocks_keep_the_rows_of_the_lookahead_inputs():
    sa = spec.TraceArrays.from_split(tracekit.split("valid"))
    sub = sa.blocks([1, 3])
    F, G = sa.features(), sub.features()
    for name in P.LOOKAHEAD_INPUT_NAMES:
        assert (G[name] == np.concatenate([F[name][sa.g:2 * sa.g],
                                          F[name][3 * sa.g:4 * sa.g]])).all()


def test_the_search_offers_the_lookahead_inputs_only_when_asked():
    tr, va = tracekit.split("train"), tracekit.split("valid")
    base = dict(generations=1, population=20, seed=1, objective="speed", tv_budget=0.02)
    plain = set(Evolution(Config(**base), tr, va).pset.arguments)
    asked = set(Evolution(Config(**base, lookahead=True), tr, va).pset.arguments)
    assert not set(P.LOOKAHEAD_INPUT_NAMES) & plain
    assert set(P.LOOKAHEAD_INPUT_NAMES) | {"slot_tv"} <= asked
    # traces without slot features: asked for, refused in one line naming the parameter
    old = T.TraceSplit({f: va.columns[f] for f in T.ALL_FIELDS}, dict(va.meta), "valid")
    old.columns["tail_draft_prob"] = old.columns["tail_draft_prob"] + 1e-9
    with pytest.raises(ConfigError, match=r"^lookahead: .*slot features"):
        Evolution(Config(**base, lookahead=True), tr, old)


def test_lookahead_is_refused_on_token_objectives():
    with pytest.raises(ConfigError, match=r"^lookahead: .*objective expected"):
        Config(objective="expected", lookahead=True).validate()


def test_signature_and_code_of_a_lookahead_rule():
    from evolve.lang import codegen
    nodes = treeio.parse("mul(target_prob, add(1.0, ahead))")
    assert P.uses_lookahead_inputs(nodes) and P.uses_slot_inputs(nodes)
    assert P.signature_of(nodes) == spec.FEATURES[:14]  # the trace world's, but its rank
    assert P.signature_of(treeio.parse("mul(target_prob, slot_tv)")) == P.SLOT_SIGNATURE
    src = codegen.function_source(nodes, "f", trace=True)
    assert "slot_kl_qp, next_tv, ahead):" in src


@pytest.mark.parametrize("tree, estimate", [
    ("add(pmin(1.0, pdiv(target_prob, draft_prob)), mul(0.01, ahead))", True),
    ("add(pmin(1.0, pdiv(target_prob, draft_prob)), mul(0.01, slot_tv))", False)])
def test_the_report_of_a_champion_that_reads_them_says_it_is_an_estimate(tree, estimate):
    from evolve.cli.render import Terminal
    from evolve.cli.views import show_trace_champion
    from evolve.tasks.base import Finished
    from evolve.tasks.traces import ESTIMATE, TraceTask
    splits = {s: tracekit.split(s) for s in ("train", "valid", "test")}
    cfg = Config(generations=1, population=20, objective="speed", tv_budget=0.03,
                 lookahead=True)
    ev = Evolution(cfg, splits["train"], splits["valid"])
    sas = {s: spec.TraceArrays.from_split(ts) for s, ts in splits.items()}
    progs = treeio.linearise([treeio.parse(tree)])
    metrics = {s: spec.population_results(progs, sa)[0].to_dict() for s, sa in sas.items()}
    rep = TraceTask().report(Finished(cfg, splits, {"train": ev.train, "valid": ev.valid},
                                      treeio.parse(tree), metrics, [tree]))
    assert rep["champion"].get("estimate") == (ESTIMATE if estimate else None)
    lines = []
    term = Terminal(json_mode=False)
    term.note = lines.append
    term.table = lambda *a, **k: None
    show_trace_champion({**rep["champion"], "metrics": metrics}, term)
    assert any("an estimate" in t for t in lines) == estimate


def test_a_lookahead_run_is_same_seed_identical_and_labels_its_champion(tmp_path):
    import evolve
    d = tmp_path / "traces"
    d.mkdir()
    for s in T.SPLITS:
        T.save(tracekit.split(s), d / f"{s}.npz")
    docs = []
    for name in ("a", "b"):
        evolve.run(data_dir=d, runs_dir=tmp_path / "runs", name=name, writeback=False,
                   generations=3, population=60, seed=2, objective="speed", tv_budget=0.03,
                   lookahead=True)
        docs.append(json.loads((tmp_path / "runs" / name / "champion.json").read_text()))
    a, b = docs
    assert a["tree"] == b["tree"] and a["metrics"] == b["metrics"]
    assert ("estimate" in a) == P.uses_lookahead_inputs(treeio.parse(a["tree"]))


@pytest.mark.parametrize("cap", [1.0, 0.2])
def test_with_lookahead_the_seeded_population_holds_the_value_gates_form(cap):
    """--seed-baselines with --lookahead puts the value gate on ``ahead`` into the first
    population (its spend capped at the run's slot-TV p99 cap, when it has one); without
    --lookahead, no tree of the first population reads ``ahead``."""
    from evolve.rules.table import GATE_THRESHOLDS, gate_tree
    tr, va = tracekit.split("train"), tracekit.split("valid")
    base = dict(generations=1, population=40, seed=1, objective="speed", tv_budget=0.02,
                seed_baselines=True, tv_p99_cap=cap)
    ev = Evolution(Config(**base, lookahead=True), tr, va)
    ev.initialise()
    trees = {treeio.to_string(treeio.from_deap(ind)) for ind in ev.population}
    want = {treeio.to_string(treeio.parse(gate_tree("ahead", t, None if cap >= 1.0 else cap)))
            for t in GATE_THRESHOLDS}
    assert want <= trees, sorted(want - trees)
    plain = Evolution(Config(**base), tr, va)
    plain.initialise()
    assert not any("ahead" in str(ind) for ind in plain.population)
