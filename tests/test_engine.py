"""The evolution loop: determinism, threads, elitism, configuration, rediscovery."""

import random

import numpy as np
import pytest

from evolve.search.config import Config, ConfigError
from evolve.search.engine import Evolution
from tests.conftest import TINY


def _strip(rec):
    return {k: v for k, v in rec.items() if k != "timing"}


def _run(splits, **kw):
    cfg = Config(**{**TINY, "seed": 5, **kw})
    ev = Evolution(cfg, splits["train"], splits["valid"])
    hist = [_strip(ev.initialise())]
    while ev.generation < cfg.generations:
        hist.append(_strip(ev.step()))
    return ev, hist


def test_same_seed_same_champion_and_history(small_splits):
    a, ha = _run(small_splits)
    b, hb = _run(small_splits)
    assert ha == hb
    assert a.champion() == b.champion()
    assert [str(i) for i in a.population] == [str(i) for i in b.population]
    c, hc = _run(small_splits, seed=6)
    assert [str(i) for i in c.population] != [str(i) for i in a.population]


def test_one_thread_and_all_threads_agree(small_splits):
    import numba
    before = numba.get_num_threads()
    try:
        a, ha = _run(small_splits, threads=1)
        b, hb = _run(small_splits, threads=numba.config.NUMBA_NUM_THREADS)
    finally:
        numba.set_num_threads(before)
    assert ha == hb and a.champion() == b.champion()


def test_engine_does_not_touch_global_random(small_splits):
    random.seed(1234)
    expected = random.random()
    random.seed(1234)
    _run(small_splits)
    assert random.random() == expected


def test_elitism_keeps_best_train_fitness(small_splits):
    _, hist = _run(small_splits, generations=8, elitism=1)
    best = [h["best_train"] for h in hist]
    assert all(b2 >= b1 for b1, b2 in zip(best, best[1:]))


def test_size_limits_hold(small_splits):
    ev, _ = _run(small_splits, generations=6, max_size=15, max_height=5, init_max_height=4)
    assert max(len(i) for i in ev.population) <= 15
    assert max(i.height for i in ev.population) <= 5


def test_seeded_population_contains_baselines(small_splits):
    ev, hist = _run(small_splits, seed_baselines=True, generations=1)
    assert hist[0]["best_train"] >= 0.7   # standard rejection is in generation 0


def test_champion_is_best_on_valid(small_splits):
    ev, _ = _run(small_splits, generations=5)
    champ = ev.champion()
    vf = ev.valid_scores([e.tree for e in ev.hof.entries])
    assert ev.valid_scores([champ.tree])[0] == vf.max()


@pytest.mark.parametrize("kw,param", [
    ({"generations": 0}, "generations"),
    ({"population": 0}, "population"),
    ({"population": 10, "tournament": 11}, "tournament"),
    ({"cx_prob": 1.5}, "cx_prob"),
    ({"mut_prob": -0.1}, "mut_prob"),
    ({"objective": "speedy"}, "objective"),
    ({"max_height": 1}, "max_height"),
    ({"population": 10, "elitism": 10}, "elitism"),
    ({"tv_position_cap": 1.5}, "tv_position_cap"),
    ({"tv_p99_cap": -0.1}, "tv_p99_cap"),
    ({"tv_first_cap": 1.01}, "tv_first_cap"),
    ({"first_tokens": 0}, "first_tokens"),
])
def test_config_errors_name_the_parameter(kw, param):
    """The configuration names the parameter (the command line names its option:
    tests/test_hostile_config.py)."""
    with pytest.raises(ConfigError) as e:
        Config(**kw).validate()
    assert str(e.value).startswith(f"{param}: ") and e.value.param == param
    assert repr(list(kw.values())[-1]) in str(e.value)


def test_state_roundtrip_continues_identically(small_splits):
    cfg = Config(**{**TINY, "generations": 6, "seed": 9})
    a = Evolution(cfg, small_splits["train"], small_splits["valid"])
    a.initialise()
    for _ in range(3):
        a.step()
    b = Evolution(cfg, small_splits["train"], small_splits["valid"])
    b.restore(a.state())
    ra = [_strip(a.step()) for _ in range(3)]
    rb = [_strip(b.step()) for _ in range(3)]
    assert ra == rb and a.champion() == b.champion()


def test_rediscovers_standard_rejection(default_splits):
    """From random trees, the seed objective finds the optimum of the seed metric."""
    from evolve.objectives.metrics import fitness
    valid = default_splits["valid"]
    std = fitness(len(valid), valid.baseline_accepts.sum(), 0, 0)
    cfg = Config(generations=25, population=200, seed=1, objective="seed")
    ev = Evolution(cfg, default_splits["train"], valid)
    ev.initialise()
    while ev.generation < cfg.generations:
        ev.step()
    champ = ev.champion()
    assert ev.valid_scores([champ.tree])[0] >= std - 0.005
    assert np.isfinite(std)


def test_speed_objective_on_traces_is_deterministic_and_feasible():
    from evolve.rules.table import seed_trees
    from tests import tracekit
    tr, va = tracekit.split("train"), tracekit.split("valid")

    def go():
        cfg = Config(generations=6, population=40, seed=2, objective="speed", tv_budget=0.02,
                     seed_baselines=True, mut_prob=0.3)
        ev = Evolution(cfg, tr, va)
        hist = [_strip(ev.initialise())]
        while ev.generation < cfg.generations:
            hist.append(_strip(ev.step()))
        return ev, hist

    a, ha = go()
    b, hb = go()
    assert ha == hb and a.champion() == b.champion()
    # the seeded standard rule is feasible (TV 0), so the champion is feasible on valid
    champ = a.champion()
    tokens, tv = a.objective.tokens_tv(a.valid, [champ.tree])
    assert tv[0] <= 0.02 and tokens[0] >= 1.0
    assert ha[-1]["best_valid"] == a.valid_scores([champ.tree])[0]
    assert all(h2["best_valid"] >= h1["best_valid"] for h1, h2 in zip(ha, ha[1:]))
    assert any("p_max" in t for t in seed_trees("traces"))
    assert not any("p_max" in t for t in seed_trees("tokens"))


def test_scale_constant_mutation_changes_one_constant():
    from evolve.lang import primitives as P
    from evolve.lang import treeio
    from evolve.search.operators import mut_scale_constant
    pset = P.make_pset(trace=True)
    ind = treeio.deap_from_string("add(mul(0.5, draft_prob), pdiv(2.0, p_max))", pset)
    before = [n.value for n in ind if n.arity == 0]
    random.seed(7)
    (out,) = mut_scale_constant(ind)
    after = [n.value for n in out if n.arity == 0]
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(changed) == 1
    a, b = changed[0]
    assert 0.5 < b / a < 2.0
    text = str(out)
    assert treeio.to_string(treeio.parse(text)) == text


def test_cli_lists_every_objective_of_the_registry():
    from click.testing import CliRunner

    from evolve.cli import main
    from evolve.objectives import OBJECTIVES
    out = CliRunner().invoke(main, ["run", "--help"], env={"COLUMNS": "400"}).output
    for name in OBJECTIVES:
        assert f"{name}:" in out


def _pareto_run(tr, va, generations, seed=4):
    cfg = Config(generations=generations, population=40, seed=seed, objective="pareto",
                 tv_budget=0.02, seed_baselines=True)
    ev = Evolution(cfg, tr, va)
    hist = [_strip(ev.initialise())]
    while ev.generation < cfg.generations:
        hist.append(_strip(ev.step()))
    return ev, hist


def test_pareto_objective_nsga2_deterministic_and_resumable():
    import json
    from tests import tracekit
    tr, va = tracekit.split("train"), tracekit.split("valid")
    a, ha = _pareto_run(tr, va, 5)
    b, hb = _pareto_run(tr, va, 5)
    assert ha == hb and a.champion() == b.champion()
    assert all(len(ind.fitness.values) == 2 for ind in a.population)
    # resume from a JSON checkpoint at generation 2 reaches the same end
    c, _ = _pareto_run(tr, va, 2)
    state = json.loads(json.dumps(c.state()))
    d = Evolution(Config.from_dict(state["config"]), tr, va)
    d.config.generations = 5
    d.restore(state)
    while d.generation < 5:
        d.step()
    assert [str(i) for i in d.population] == [str(i) for i in a.population]
    assert d.champion() == a.champion()
    # the population is non-dominated-sorted: the first individual is on the front
    from deap import tools
    front = tools.sortNondominated(a.population, len(a.population), first_front_only=True)[0]
    assert a.population[0] in front


def test_pareto_needs_population_multiple_of_4():
    with pytest.raises(ConfigError, match="multiple of 4"):
        Config(objective="pareto", population=42).validate()


def _trace_champion(**kw) -> str:
    """The champion tree of a short run on the tiny traces."""
    from tests import tracekit
    cfg = Config(generations=4, population=40, seed=3, seed_baselines=True, **kw)
    ev = Evolution(cfg, tracekit.split("train"), tracekit.split("valid"))
    ev.initialise()
    while ev.generation < cfg.generations:
        ev.step()
    return ev.champion().tree


def test_speed_kl_and_position_cap_hold_on_valid():
    """speed_kl keeps the champion's KL per token within --budget-kl; a cap on slot TV
    per block position keeps every position's TV under it, where the uncapped run
    spends more than the cap at some position."""
    from evolve.objectives import OBJECTIVES
    from tests import tracekit
    with_kl = OBJECTIVES["speed_kl"]          # its evaluator sums KL too
    valid = with_kl.evaluator(tracekit.split("valid"), "valid")

    def champion(**kw):
        m = with_kl.measures(valid, [_trace_champion(**kw)])
        return {k: v[0] for k, v in m.items()}

    kl = champion(objective="speed_kl", kl_budget=0.002)
    assert kl["kl"] <= 0.002 and kl["tokens"] > 1.0
    free = champion(objective="speed", tv_budget=0.05)
    cap = 0.6 * float(free["tv_pos"].max())
    capped = champion(objective="speed", tv_budget=0.05, tv_position_cap=cap)
    assert free["tv_pos"].max() > cap
    assert capped["tv_pos"].max() <= cap and capped["tv"] <= 0.05


def test_first_tokens_tv_of_the_kernel_is_the_reference():
    """The first-tokens TV the search scores by (the kernel over the blocks starting
    within the first k tokens) is the numpy reference's reach-weighted mean slot TV over
    the slots at distance < k, for several trees and k; at k = 1 it is the report's TV
    of the answer's first token (``tv_by_distance``)."""
    from evolve.lang import treeio
    from evolve.objectives import OBJECTIVES
    from evolve.objectives import spec
    from evolve.objectives.trace_objectives import first_tv
    from evolve.rules.tuning import tree_thresholds
    from tests import tracekit
    split = tracekit.split("valid")
    ev = OBJECTIVES["speed"].evaluator(split, "valid")
    sa = spec.TraceArrays.from_split(split)
    trees = ["pdiv(target_prob, draft_prob)", "add(target_prob, 0.3)",
             "mul(position, target_prob)", "sub(0.9, block_position)", "0.0"]
    for k in (1, 2, 3, 6, 11):
        got = first_tv(ev, trees, k)
        for t, x in zip(trees, got):
            h = tree_thresholds(treeio.parse(t), sa)
            assert x == pytest.approx(spec.tv_first(sa, h, 11)[k - 1], rel=1e-9, abs=1e-12)
            if k == 1:
                assert x == pytest.approx(spec.tv_by_distance(sa, h)["0"]["tv"], abs=1e-12)
    assert got[0] < 1e-9 < got[1]          # lossless does not distort, a lenient rule does


def test_first_tokens_cap_holds_the_answers_first_tokens():
    """--cap-tv-first: the champion (chosen on valid) keeps its mean slot TV over the
    first two tokens after the prompt within the cap on valid, where the uncapped
    champion's is above it; its report carries that TV by k and scores by it."""
    from evolve.lang import treeio
    from evolve.objectives import OBJECTIVES, spec
    from evolve.rules.tuning import tree_thresholds
    from tests import tracekit
    va = tracekit.split("valid")
    sa = spec.TraceArrays.from_split(va)

    def first(tree):
        return spec.tv_first(sa, tree_thresholds(treeio.parse(tree), sa), 2)[1]

    free = _trace_champion(objective="speed", tv_budget=0.05)
    cap = 0.5 * first(free)
    capped = _trace_champion(objective="speed", tv_budget=0.05, tv_first_cap=cap,
                             first_tokens=2)
    assert first(free) > cap >= first(capped)
    obj = OBJECTIVES["speed"]
    cfg = Config(objective="speed", tv_budget=0.05, tv_first_cap=cap, first_tokens=2)
    m = obj.metrics(treeio.parse(capped), {"valid": va}, {})["valid"]
    assert m["tv_first"][1] == pytest.approx(first(capped))
    assert obj.split_score(m, cfg) > 1.0
    m_free = obj.metrics(treeio.parse(free), {"valid": va}, {})["valid"]
    assert obj.split_score(m_free, cfg) < 1.0     # over the cap: below every feasible rule


def test_p99_cap_holds_the_tail_of_slot_tv():
    """--cap-tv-p99: the champion's reach-weighted 99th percentile of slot TV is
    within the cap on train and valid, where the uncapped champion's is above it."""
    from evolve.lang import treeio
    from evolve.objectives import OBJECTIVES
    from evolve.objectives.spec import TraceArrays, objectives
    from evolve.rules.tuning import tree_thresholds
    from tests import tracekit
    tr, va = tracekit.split("train"), tracekit.split("valid")

    def p99(tree, split):
        sa = TraceArrays.from_split(split)
        return objectives(sa, tree_thresholds(treeio.parse(tree), sa)).tv_p99

    free = _trace_champion(objective="speed", tv_budget=0.05)
    cap = 0.5 * p99(free, tr)
    capped = _trace_champion(objective="speed", tv_budget=0.05, tv_p99_cap=cap)
    assert p99(free, tr) > cap and p99(capped, tr) <= cap and p99(capped, va) <= cap * 1.5
    m = OBJECTIVES["speed"].measures(OBJECTIVES["speed"].evaluator(tr, "train", Config(
        objective="speed", tv_p99_cap=cap)), [capped, free])
    assert m["tail_share"][0] <= 0.01 < m["tail_share"][1]


def test_the_target_rank_is_offered_where_both_splits_record_it():
    """Traces of schema v4 offer ``target_rank`` to a search, and the kernel scores a
    rule that reads it as the numpy reference does (the candidates' recorded ranks);
    traces without the ranks (schema v3) do not offer it, and asking for it there is
    one ConfigError naming ``inputs``."""
    from evolve.data.traces import V4_FIELDS, TraceSplit
    from evolve.objectives import spec
    from tests import tracekit
    tr, va = tracekit.split("train"), tracekit.split("valid")
    ev = Evolution(Config(objective="speed", generations=1, population=20), tr, va)
    assert "target_rank" in ev.inputs
    tree = "ite(lt(target_rank, 1.5), pmin(1.0, add(pdiv(target_prob, draft_prob), 0.4)), " \
           "pdiv(target_prob, draft_prob))"
    sa = spec.TraceArrays.from_split(va)
    np.testing.assert_array_equal(sa.features()["target_rank"], va.columns["cand_target_rank"])
    _scored_as_the_reference(va, sa, tree)                 # the rank matters here

    def v3(ts):
        return TraceSplit({f: v for f, v in ts.columns.items() if f not in V4_FIELDS},
                          dict(ts.meta, format_version=3), ts.name)
    ev = Evolution(Config(objective="speed", generations=1, population=20), v3(tr), v3(va))
    assert "target_rank" not in ev.inputs and "slot_tv" in ev.inputs
    with pytest.raises(ConfigError, match=r"inputs.*'target_rank' is not offered"):
        Evolution(Config(objective="speed", generations=1, population=20,
                         inputs="target_prob,target_rank"), v3(tr), v3(va))
    # named with a ?, an input is used where the data offer it (evolve run --engine)
    cfg = Config(objective="speed", generations=1, population=20,
                 inputs="target_prob,draft_prob,target_rank?")
    assert Evolution(cfg, v3(tr), v3(va)).inputs == ("draft_prob", "target_prob")
    assert Evolution(cfg, tr, va).inputs == ("draft_prob", "target_prob", "target_rank")


def _scored_as_the_reference(va, sa, tree: str) -> None:
    """The kernel scores ``tree`` on ``va`` as the numpy reference does, and it accepts
    more than the lossless rule (the input it reads matters)."""
    from evolve.lang import treeio
    from evolve.objectives import OBJECTIVES, spec
    from evolve.rules.tuning import tree_thresholds
    want = spec.objectives(sa, tree_thresholds(treeio.parse(tree), sa))
    got = OBJECTIVES["speed"].measures(OBJECTIVES["speed"].evaluator(va, "valid"), [tree])
    assert got["tokens"][0] == pytest.approx(want.tokens_per_call, rel=1e-12)
    assert got["tv"][0] == pytest.approx(want.tv_per_token, rel=1e-9)
    lossless = spec.objectives(sa, tree_thresholds(treeio.parse(
        "pdiv(target_prob, draft_prob)"), sa))
    assert want.tokens_per_call > lossless.tokens_per_call


def test_the_token_class_is_offered_where_both_splits_carry_the_vocabulary():
    """Traces whose meta carries the pair's vocabulary classes offer ``token_class``:
    the candidates' classes in the input matrix are the table at each candidate token
    (counted here token by token), and the kernel scores a rule that reads it as the
    numpy reference does; without the table it is not offered, and asking for it is
    one ConfigError naming ``inputs``."""
    from evolve.data import vocab_class as VC
    from evolve.data.traces import TraceSplit
    from evolve.objectives import spec
    from tests import tracekit
    tr, va = tracekit.split("train"), tracekit.split("valid")
    ev = Evolution(Config(objective="speed", generations=1, population=20), tr, va)
    assert "token_class" in ev.inputs
    sa = spec.TraceArrays.from_split(va)
    table = [VC.token_class(chr(b)) if b < 128 else 3 for b in range(256)]
    want_cls = np.array([[table[int(t)] for t in row] for row in va.columns["cand_token"]])
    np.testing.assert_array_equal(sa.features()["token_class"], want_cls)
    assert set(np.unique(want_cls)) >= {0, 2, 3}            # words, punctuation, spaces
    tree = "ite(lt(token_class, 0.5), pmin(1.0, add(pdiv(target_prob, draft_prob), 0.4)), " \
           "pdiv(target_prob, draft_prob))"
    _scored_as_the_reference(va, sa, tree)                 # the class matters here

    def bare(ts):
        return TraceSplit(ts.columns, {k: v for k, v in ts.meta.items()
                                       if k != VC.META_KEY}, ts.name)
    ev = Evolution(Config(objective="speed", generations=1, population=20), tr, bare(va))
    assert "token_class" not in ev.inputs and "target_rank" in ev.inputs
    with pytest.raises(ConfigError, match=r"inputs.*'token_class' is not offered"):
        Evolution(Config(objective="speed", generations=1, population=20,
                         inputs="target_prob,token_class"), bare(tr), bare(va))
