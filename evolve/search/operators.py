"""DEAP individuals and the pieces of DEAP's toolbox the engine registers.

The operators are DEAP's own (``genHalfAndHalf``, ``selDoubleTournament``,
``cxOnePoint``, ``mutUniform``, ``mutNodeReplacement``, ``mutShrink``,
``mutEphemeral``, NSGA-II's selections). What is here makes them cheaper
without changing a single draw: a clone that copies the node list instead of
deep-copying nodes, the size and height limits snapshotting parents instead of
deep-copying them, remembered tree text, and one more mutation
(``mut_scale_constant``) for trace objectives. ``cx_one_point`` is
``cxOnePoint`` with its node types in a fixed order, so that a seed gives the
same run on every build of Python.
"""

from __future__ import annotations

import functools
import gc
import math
import random
from contextlib import contextmanager


@contextmanager
def fewer_collections(threshold: int = 10_000):
    """Run the loop with Python's cyclic garbage collector looking less often.

    By default it scans its youngest objects every 700 new container objects; a
    generation of 1000 individuals makes tens of thousands (trees, node lists,
    fitness objects), none in reference cycles, so most of those scans find
    nothing. Memory is still freed at once by reference counting."""
    old = gc.get_threshold()
    gc.set_threshold(threshold, *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)


@functools.lru_cache(maxsize=None)
def individual_class(weights: tuple):
    """The DEAP individual class of an objective's fitness weights (one class per
    weights, made once)."""
    from deap import base, gp    # lazy: start-up (DEAP loads only where it is used)

    class Fitness(base.Fitness):
        pass
    Fitness.weights = weights

    class Individual(gp.PrimitiveTree):
        text = None     # str(self) while the fitness is valid (see text_of)

        def __init__(self, content=()):
            super().__init__(content)
            self.fitness = Fitness()
            self.born = 0

    return Individual


def static_limit(max_height: int, max_size: int):
    """DEAP's two ``gp.staticLimit`` decorators in one (height inside, size
    outside, as ``toolbox.decorate`` stacks them): an offspring over a limit is
    replaced by a copy of a random one of the parents as they were before the
    operator ran. Same rule, same random draws and the same sharing of copies as
    the stacked decorators, so a run walks the same trajectory; but the parents
    are snapshotted as node lists and copied only when a limit is hit, instead
    of deep-copied twice on every call."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            snaps = [(type(ind), list(ind), ind.fitness.wvalues, ind.born) for ind in args]
            new = list(func(*args, **kwargs))
            # a tree of n nodes is at most n - 1 high: measure only taller-looking ones
            for over in (lambda t: len(t) > max_height + 1 and t.height > max_height,
                         lambda t: len(t) > max_size):
                copies: dict = {}   # one copy per parent and decorator level, like DEAP's
                for i, ind in enumerate(new):
                    if over(ind):
                        j = _choice_index(len(snaps))
                        if j not in copies:
                            copies[j] = _from_snapshot(*snaps[j])
                        new[i] = copies[j]
            return new
        return wrapper
    return decorator


def cx_one_point(ind1, ind2, types: tuple = (float, bool)):
    """DEAP's ``gp.cxOnePoint``, draw for draw, except for the order of the node
    types both trees have: the types are taken in ``types`` order (the primitive
    set's), then any others by name.

    DEAP draws the crossover's type with ``random.choice(list(set(...)))``. The
    order of a set of types follows their hashes, that is the addresses of the
    type objects in the interpreter's binary, so it differs between builds of
    Python: CPython 3.11.7 lists ``float`` before ``bool``, 3.12.1 ``bool``
    before ``float``. The same seed then walked different trajectories; with a
    fixed order it walks the same one on every build (the one DEAP's walks where
    the set lists the types in the primitive set's order)."""
    if len(ind1) < 2 or len(ind2) < 2:
        return ind1, ind2              # no crossover on a single node tree
    types1: dict = {}
    types2: dict = {}
    for idx, node in enumerate(ind1[1:], 1):
        types1.setdefault(node.ret, []).append(idx)
    for idx, node in enumerate(ind2[1:], 1):
        types2.setdefault(node.ret, []).append(idx)
    common = [t for t in types if t in types1 and t in types2]
    common += sorted((t for t in types1 if t in types2 and t not in types), key=repr)
    if common:
        type_ = random.choice(common)
        index1 = random.choice(types1[type_])
        index2 = random.choice(types2[type_])
        slice1 = ind1.searchSubtree(index1)
        slice2 = ind2.searchSubtree(index2)
        ind1[slice1], ind2[slice2] = ind2[slice2], ind1[slice1]
    return ind1, ind2


def _choice_index(n: int) -> int:
    """The index ``random.choice(seq)`` picks for a sequence of length n (same draws)."""
    return random.choice(range(n))


def _from_snapshot(cls, nodes, wvalues, born):
    new = cls(nodes)
    new.fitness.wvalues = wvalues
    new.born = born
    return new


def clone(ind):
    """A copy of an individual that shares its node objects.

    DEAP's operators never change a node in place (crossover, mutation and
    shrinking replace list items), so copying the node list is enough; it is
    several times cheaper than deepcopy, which DEAP's examples use, and the
    fitness is copied without going through Fitness.__init__."""
    cls = type(ind)
    new = list.__new__(cls)
    list.__init__(new, ind)
    fit = ind.fitness
    new.fitness = f = object.__new__(type(fit))
    f.wvalues = fit.wvalues
    new.born = ind.born
    if fit.wvalues:
        new.text = ind.text
    return new


def text_of(ind) -> str:
    """``str(ind)``, remembered while the fitness is valid: every operator that
    changes a tree in place is followed by invalidating its fitness (varAnd)."""
    if ind.fitness.wvalues and ind.text is not None:
        return ind.text
    s = str(ind)
    if ind.fitness.wvalues:
        ind.text = s
    return s


def mut_scale_constant(ind):
    """Scale one constant by exp(N(0, 0.1)): fine-tunes a rule's parameters (trace
    runs, where the budget makes small parameter changes matter)."""
    from deap import gp    # lazy: start-up (DEAP loads only where it is used)
    idx = [i for i, node in enumerate(ind) if isinstance(type(node), gp.MetaEphemeral)]
    if not idx:
        return (ind,)
    i = random.choice(idx)
    old = ind[i]
    value = round(float(old.value) * math.exp(random.gauss(0.0, 0.1)), 6)
    new = type(old).__new__(type(old))
    gp.Terminal.__init__(new, value, False, old.ret)
    ind[i] = new
    return (ind,)
