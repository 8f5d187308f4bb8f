"""Variation over arrays (evolve.vary) makes exactly the trees DEAP makes.

Every comparison is against DEAP itself: ``algorithms.varAnd`` with the
engine's toolbox (cxOnePoint, the four mutations, the height and size limits)
on the same parents from the same generator state must give the same offspring
texts, the same fitness validity and leave the generator in the same state;
whole runs in array mode must equal runs on DEAP's operators.
"""

import math
import random

import numpy as np
import pytest
from deap import algorithms, gp
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve import engine as E
from evolve import primitives as P
from evolve import stream, treeio, vary
from evolve.engine import Config, Evolution
from tests.conftest import TINY

PSET = P.make_pset()
TABLE = vary.Table.build(PSET)


def _engine(**kw) -> Evolution:
    """An engine on DEAP's operators, for its toolbox only (no data needed)."""
    ev = Evolution.__new__(Evolution)
    ev.config = Config(**kw)
    ev.trace = ev.pareto = False
    ev.pset = PSET
    ev.toolbox = ev._toolbox()
    return ev


def _population(seed: int, n: int, max_init: int):
    """Random DEAP trees of heights 0..max_init with distinct fitness and birth."""
    r = random.Random(seed)
    outer = random.getstate()
    random.setstate(r.getstate())
    try:
        pop = []
        for i in range(n):
            ind = E.Individual(gp.genHalfAndHalf(PSET, 0, random.randint(0, max_init)))
            ind.fitness.values = (random.random(),)
            ind.born = i
            pop.append(ind)
        chosen = [random.randrange(n) for _ in range(n)]
    finally:
        random.setstate(outer)
    return pop, chosen


def _both(seed, n, max_init, cx, mut, max_height, max_size, skip=0):
    """(DEAP's offspring, DEAP's generator, ours as a Population, our generator)."""
    ev = _engine(population=max(n, 2), max_height=max_height, max_size=max_size,
                 init_max_height=min(2, max_height))
    pop, chosen = _population(seed, n, max_init)
    ev._rng = random.Random(seed + 1)
    ev._mt, ev._rng_behind = None, False
    for _ in range(skip):
        ev._rng.getrandbits(32)
    with ev._random():
        want = algorithms.varAnd([pop[i] for i in chosen], ev.toolbox, cx, mut)
    ours = random.Random(seed + 1)
    for _ in range(skip):
        ours.getrandbits(32)
    arr = vary.from_deap(TABLE, pop, [i.fitness.wvalues[0] for i in pop], [i.born for i in pop])
    mt, pos, version, gauss = stream.state_arrays(ours)
    got = vary.vary(TABLE, arr, np.array(chosen), np.array([], dtype=np.int64), mt, pos,
                    cx, mut, max_height, max_size, generation=99)
    stream.set_state(ours, mt, pos, version, gauss)
    return want, ev._rng, got, ours


def _check(want, deap_rng, got, ours):
    assert [vary.text(TABLE, got, i) for i in range(len(got))] == [str(w) for w in want]
    assert (~np.isnan(got.fit)).tolist() == [w.fitness.valid for w in want]
    for i, w in enumerate(want):
        if w.fitness.valid:   # an untouched clone keeps its parent's fitness and birth
            assert (got.fit[i], got.born[i]) == (w.fitness.wvalues[0], w.born)
        else:
            assert got.born[i] == 99
    assert ours.getstate() == deap_rng.getstate()


def test_this_interpreter_is_supported():
    assert TABLE is not None
    assert stream.stream_matches() and vary.stream_matches()


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), n=st.integers(1, 60), max_init=st.integers(0, 6),
       cx=st.sampled_from([0.0, 0.3, 0.7, 1.0]), mut=st.sampled_from([0.0, 0.25, 1.0]),
       limits=st.sampled_from([(10, 60), (4, 12), (2, 5), (3, 1000), (30, 7)]),
       skip=st.sampled_from([0, 600, 623]))
def test_varand_equals_deap(seed, n, max_init, cx, mut, limits, skip):
    _check(*_both(seed, n, max_init, cx, mut, *limits, skip=skip))


def test_shared_copies_behave_as_in_deap():
    """Both children of a crossover over a limit, replaced by the same parent's
    copy, are one object in DEAP: mutating one mutates the other. The cases
    below contain such offspring, and the arrays follow them."""
    shared = 0
    for seed in range(40):
        want, deap_rng, got, ours = _both(seed, 30, 6, 1.0, 0.5, 2, 5)
        _check(want, deap_rng, got, ours)
        shared += len({id(w) for w in want}) < len(want)
    assert shared >= 5


@settings(max_examples=300, deadline=None)
@given(x=st.floats(-1.0, 1.0))
def test_round3_is_pythons(x):
    got = vary._round3(x)
    assert got == round(x, 3) and math.copysign(1, got) == math.copysign(1, round(x, 3))


def test_round3_ties_and_neighbours():
    for k in range(-1000, 1000):
        for v in ((k + 0.5) / 1000, k / 1000):
            for y in (np.nextafter(v, -2.0), v, np.nextafter(v, 2.0)):
                y = float(y)
                if abs(y) <= 1.0:
                    r = vary._round3(y)
                    assert r == round(y, 3) and math.copysign(1, r) == math.copysign(1, round(y, 3))


def _trees(seed, n=200):
    pop, _ = _population(seed, n, 6)
    # constants that differ only in sign or in the last bit
    pop.append(treeio.deap_from_string("add(0.0, draft_prob)", PSET, E.Individual))
    pop.append(treeio.deap_from_string("add(-0.0, draft_prob)", PSET, E.Individual))
    pop.append(treeio.deap_from_string("add(0.1, draft_prob)", PSET, E.Individual))
    pop.append(treeio.deap_from_string("add(0.10000000000000002, draft_prob)", PSET,
                                       E.Individual))
    return pop


def test_text_conversion_and_programs_agree_with_deap():
    pop = _trees(3)
    arr = vary.from_deap(TABLE, pop)
    assert [vary.text(TABLE, arr, i) for i in range(len(pop))] == [str(t) for t in pop]
    assert [str(vary.to_deap(TABLE, arr, i, E.Individual)) for i in range(len(pop))] == \
        [str(t) for t in pop]
    want = treeio.linearise([treeio.from_deap(t) for t in pop])
    got = vary.programs(TABLE, arr, np.arange(len(pop)))
    for f in ("ops", "consts", "starts", "lengths"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f))
    assert got.max_stack == want.max_stack


def test_hashes_are_equal_exactly_for_equal_texts():
    pop = _trees(4) + _trees(4)
    arr = vary.from_deap(TABLE, pop)
    texts = [str(t) for t in pop]
    keys = list(zip(arr.h1.tolist(), arr.h2.tolist()))
    for i in range(len(pop)):
        for j in range(i + 1, len(pop)):
            assert (keys[i] == keys[j]) == (texts[i] == texts[j])


@pytest.mark.parametrize("limit", [1, 7, 1000])
def test_fitness_cache_is_right_and_bounded(limit):
    cache = vary.FitnessCache(limit)
    r = np.random.default_rng(0)
    calls = []

    def score(idx):
        calls.append(len(idx))
        return h1[idx] * 0.5
    for _ in range(20):
        n = 30
        h1 = r.integers(0, 15, n).astype(np.int64)
        pop = vary.Population(None, None, None, None, np.full(n, np.nan),
                              np.zeros(n, dtype=np.int64), h1, h1 * 3)
        pop.fit[:5] = 7.0      # already evaluated: left alone
        todo, unique = cache.evaluate(pop, score)
        assert todo == n - 5 and unique == len(set(h1[5:].tolist()))
        assert pop.fit[:5].tolist() == [7.0] * 5
        assert pop.fit[5:].tolist() == (h1[5:] * 0.5).tolist()
        assert len(cache) <= limit
    if limit == 1000:   # everything remembered: later generations score nothing new
        assert calls[-1] < 5


def _run(splits, arrays, **kw):
    cfg = Config(**{**TINY, "generations": 8, "seed": 5, **kw})
    ev = Evolution(cfg, splits["train"], splits["valid"], arrays=arrays)
    assert ev.arrays == arrays
    hist = [ev.initialise()] + [ev.step() for _ in range(cfg.generations)]
    for h in hist:
        h.pop("timing")
    return ev, hist


@pytest.mark.parametrize("kw", [
    {},
    {"population": 90, "max_height": 3, "max_size": 9, "init_max_height": 3, "cx_prob": 1.0,
     "mut_prob": 0.0, "elitism": 0},
    {"population": 70, "objective": "seed", "seed_baselines": True, "max_height": 5,
     "max_size": 15},
])
def test_array_engine_walks_deaps_trajectory(small_splits, kw):
    a, ha = _run(small_splits, True, **kw)
    b, hb = _run(small_splits, False, **kw)
    assert ha == hb
    assert a.state() == b.state()
    assert a.champion() == b.champion()
    assert [str(i) for i in a.population] == [str(i) for i in b.population]
    assert [i.fitness.values for i in a.population] == [i.fitness.values for i in b.population]


def test_checkpoint_in_the_middle_changes_nothing(small_splits):
    """Reading the state (as the runner does every generation) in array mode
    leaves the run where it would have been."""
    ref, h_ref = _run(small_splits, True)
    cfg = Config(**{**TINY, "generations": 8, "seed": 5})
    ev = Evolution(cfg, small_splits["train"], small_splits["valid"])
    hist = [ev.initialise()]
    for _ in range(cfg.generations):
        ev.state()
        hist.append(ev.step())
    for h in hist:
        h.pop("timing")
    assert hist == h_ref and ev.state() == ref.state()


def test_deap_operators_where_the_stream_differs(small_splits, monkeypatch):
    monkeypatch.setattr(vary, "stream_matches", lambda: False)
    ev, hist = _run(small_splits, False)
    assert not Evolution(Config(**TINY), small_splits["train"], small_splits["valid"]).arrays
    assert len(hist) == 9


@pytest.mark.parametrize("arrays", [True, False])
def test_more_new_trees_than_the_cache_holds(small_splits, monkeypatch, arrays):
    """A generation with more new trees than the fitness cache's limit still
    gives every individual its fitness."""
    monkeypatch.setattr(E.Evaluator, "CACHE_LIMIT", 5)
    ev, hist = _run(small_splits, arrays, generations=3)
    fresh = E.Evaluator(small_splits["train"], "check")
    texts = [str(i) for i in ev.population]
    assert [i.fitness.values[0] for i in ev.population] == \
        fresh.fitness("expected", texts).tolist()


def test_running_out_of_room_starts_over_with_more():
    """Too small an arena or object table: the step starts again from the same
    generator state with more room, and makes the same trees."""
    pop, chosen = _population(8, 40, 6)
    arr = vary.from_deap(TABLE, pop, [i.fitness.wvalues[0] for i in pop], [i.born for i in pop])
    outs = []
    for room in (None, (1, 1), (200, 1), (1, 10_000)):
        work = vary.Workspace()
        mt, pos, _, _ = stream.state_arrays(random.Random(3))
        out = vary.vary(TABLE, arr, np.array(chosen), np.array([0, 1]), mt, pos, 1.0, 0.5, 2, 5,
                        generation=1, work=work, room=room)
        outs.append(([vary.text(TABLE, out, i) for i in range(len(out))], mt.tolist(), pos[0]))
        if room is not None:
            assert work.retries > 0
    assert all(o == outs[0] for o in outs[1:])
