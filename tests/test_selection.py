"""The engine's fast paths make exactly the choices DEAP's own operators make.

Selection over arrays, the snapshot-based size/height limit, remembered tree
text, the fitness cache and the array-fed hall of fame are each compared with
the DEAP (or previous, per-individual) way of doing the same thing: same
chosen individuals, same random-number state afterwards, same results.
"""

import operator
import random

import numpy as np
import pytest
from deap import base, gp, tools
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve import engine as E
from evolve import primitives as P
from evolve import selection
from evolve.engine import Config, Evolution, HallOfFame, HofEntry
from tests.conftest import TINY


class _Fit(base.Fitness):
    weights = (1.0,)


class _Ind(list):
    def __init__(self, size, value):
        super().__init__(range(size))
        self.fitness = _Fit((value,))


def test_stream_is_read_as_documented():
    # CPython's Mersenne Twister; where this fails the engine uses DEAP's operator
    assert selection.stream_matches()


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 2100), k=st.integers(1, 300), fitness_size=st.integers(1, 9),
       parsimony=st.floats(1.0, 2.0), seed=st.integers(0, 2 ** 32 - 1),
       distinct=st.integers(1, 6), skip=st.sampled_from([0, 1, 300, 622, 623, 624, 1000]))
def test_double_tournament_equals_deap(n, k, fitness_size, parsimony, seed, distinct, skip):
    r = random.Random(seed)
    # few distinct fitness values and sizes, so ties decide many tournaments
    values = [r.random() for _ in range(distinct)]
    pop = [_Ind(r.randint(1, 4), r.choice(values)) for _ in range(n)]
    deap_rng = random.Random(seed + 1)
    ours_rng = random.Random(seed + 1)
    for g in (deap_rng, ours_rng):   # start anywhere in the generator's 624-word block
        for _ in range(skip):
            g.getrandbits(32)
    saved = random.getstate()
    try:
        random.setstate(deap_rng.getstate())
        want = tools.selDoubleTournament(pop, k, fitness_size, parsimony, fitness_first=True)
        deap_rng.setstate(random.getstate())
    finally:
        random.setstate(saved)
    wfit = np.array([i.fitness.wvalues[0] for i in pop])
    sizes = np.array([len(i) for i in pop])
    got = selection.double_tournament(ours_rng, wfit, sizes, k, fitness_size, parsimony)
    index = {id(ind): i for i, ind in enumerate(pop)}
    assert [index[id(ind)] for ind in want] == got.tolist()
    assert ours_rng.getstate() == deap_rng.getstate()


def test_double_tournament_reads_the_random_module_state():
    # the engine passes the random module itself (its state swapped in)
    pop_fit = np.linspace(0.0, 1.0, 50)
    sizes = np.arange(50) % 5 + 1
    random.seed(3)
    a = selection.double_tournament(random, pop_fit, sizes, 40, 7, 1.4)
    after = random.random()
    random.seed(3)
    b = selection.double_tournament(random, pop_fit, sizes, 40, 7, 1.4)
    assert a.tolist() == b.tolist() and random.random() == after


def _deap_limited(func, max_height, max_size):
    f = gp.staticLimit(key=operator.attrgetter("height"), max_value=max_height)(func)
    return gp.staticLimit(key=len, max_value=max_size)(f)


@pytest.mark.parametrize("seed", range(40))
def test_static_limit_equals_deaps_stacked_decorators(seed):
    pset = P.make_pset()
    r = random.Random(seed)
    max_height, max_size = r.choice([(2, 5), (3, 8), (4, 12), (10, 60)])

    def trees():
        random.seed(seed)
        out = []
        for _ in range(2):
            ind = E.Individual(gp.genHalfAndHalf(pset, 1, 4))
            ind.fitness.values = (0.5,)
            out.append(ind)
        return out

    def mutate(ind):
        return gp.mutUniform(ind, expr=lambda pset, type_: gp.genFull(pset, 0, 3, type_),
                             pset=pset)

    saved = random.getstate()
    try:
        for op in (gp.cxOnePoint, mutate):
            n_args = 2 if op is gp.cxOnePoint else 1
            a = trees()[:n_args]
            parents = [str(t) for t in a]
            random.seed(seed * 7 + 1)
            want = _deap_limited(op, max_height, max_size)(*a)
            want_state = random.getstate()
            b = trees()[:n_args]
            random.seed(seed * 7 + 1)
            got = E._static_limit(max_height, max_size)(op)(*b)
            assert random.getstate() == want_state
            assert [str(t) for t in got] == [str(t) for t in want]
            assert [t.fitness.values for t in got] == [t.fitness.values for t in want]
            # the same sharing of replacement copies as DEAP's decorators
            same = [[x is y for y in want] for x in want]
            assert [[x is y for y in got] for x in got] == same
            # within the limits, or a parent as it was before the operator
            assert all((t.height <= max_height and len(t) <= max_size) or str(t) in parents
                       for t in got)
    finally:
        random.setstate(saved)


def test_clone_copies_fitness_and_text_only_while_valid():
    pset = P.make_pset()
    ind = E.Individual(gp.PrimitiveTree.from_string("add(draft_prob, 1.0)", pset))
    ind.fitness.values = (0.25,)
    assert E._text(ind) == str(ind) and ind.text == str(ind)
    c = E._clone(ind)
    assert c == ind and c is not ind and c.fitness is not ind.fitness
    assert c.fitness.values == (0.25,) and c.text == ind.text and c.born == ind.born
    del c.fitness.values
    c[2] = pset.terminals[float][1]
    assert E._text(c) == str(c)        # invalid fitness: text recomputed
    d = E._clone(c)
    assert not d.fitness.valid and E._text(d) == str(d)


def _old_update(hof, population, score):
    """The hall-of-fame update as it was, one individual at a time."""
    have = {e.tree: e for e in hof.entries}
    for text, f, size, born in population:
        if text in have:
            continue
        e = HofEntry(text, f, size, born)
        if len(hof.entries) >= hof.size and hof._key(e) >= hof._key(hof.entries[-1]):
            continue
        have[text] = e
        hof.entries.append(e)
        hof.entries.sort(key=hof._key)
        if len(hof.entries) > hof.size:
            have.pop(hof.entries.pop().tree, None)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), size=st.integers(1, 6))
def test_hall_of_fame_update_equals_one_by_one(data, size):
    a, b = HallOfFame(size), HallOfFame(size)
    for _ in range(data.draw(st.integers(1, 4))):
        n = data.draw(st.integers(1, 30))
        texts = [f"t{data.draw(st.integers(0, 20))}" for _ in range(n)]
        # a tree's fitness and size are functions of its text (many ties); born varies
        fits = [(int(t[1:]) % 3) / 2 for t in texts]
        sizes = [int(t[1:]) // 3 % 4 + 1 for t in texts]
        borns = [data.draw(st.integers(0, 3)) for _ in range(n)]
        _old_update(a, list(zip(texts, fits, sizes, borns)), None)
        b.update(texts, np.array(fits), np.array(sizes), borns)
        assert a.entries == b.entries


def _run(splits, **kw):
    cfg = Config(**{**TINY, "generations": 6, "seed": 11, **kw})
    ev = Evolution(cfg, splits["train"], splits["valid"])
    hist = [ev.initialise()] + [ev.step() for _ in range(cfg.generations)]
    for h in hist:
        h.pop("timing")
    return ev, hist


def test_engine_with_deaps_selection_walks_the_same_trajectory(small_splits, monkeypatch):
    fast, h_fast = _run(small_splits, population=60)
    monkeypatch.setattr(selection, "stream_matches", lambda: False)
    slow, h_slow = _run(small_splits, population=60)
    assert h_fast == h_slow
    assert fast.state() == slow.state()


def test_remembered_text_and_cached_fitness_are_right(small_splits):
    ev, _ = _run(small_splits, population=60)
    fresh = E.Evaluator(small_splits["train"], "check")
    texts = [str(ind) for ind in ev.population]
    assert [E._text(ind) for ind in ev.population] == texts
    want = fresh.fitness("expected", texts)
    assert [ind.fitness.values[0] for ind in ev.population] == want.tolist()


def test_timing_parts_are_recorded(small_splits):
    cfg = Config(**{**TINY, "seed": 2})
    ev = Evolution(cfg, small_splits["train"], small_splits["valid"])
    for rec in (ev.initialise(), ev.step()):
        t = rec["timing"]
        assert set(t["parts"]) == {"selection", "variation", "evaluation", "hall_of_fame"}
        assert all(v >= 0 for v in t["parts"].values())
        assert sum(t["parts"].values()) <= t["seconds"] + 1e-6
        assert t["parts"]["evaluation"] >= t["kernel_seconds"]


@pytest.mark.parametrize("max_height", [2, 3, 5, 10])
def test_static_limit_height_of_unary_chains(max_height):
    # n nodes are at most n - 1 high; a chain of unary nodes is exactly that high
    pset = P.make_pset()
    parent = E.Individual(gp.PrimitiveTree.from_string("draft_prob", pset))

    def chain(links):
        text = "neg(" * links + "draft_prob" + ")" * links
        return lambda ind: (E.Individual(gp.PrimitiveTree.from_string(text, pset)),)

    ok = E._static_limit(max_height, 60)(chain(max_height))(parent)[0]
    assert ok.height == max_height and str(ok).count("neg") == max_height
    over = E._static_limit(max_height, 60)(chain(max_height + 1))(parent)[0]
    assert str(over) == "draft_prob"
