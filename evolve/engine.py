"""The evolution loop: DEAP trees, selection, variation, bloat control, elitism.

All randomness comes from one ``random.Random`` state owned by the engine; it
is swapped into Python's ``random`` module only while DEAP code runs (DEAP's
operators draw from the module functions), so nothing leaks between engines
or into the caller. The state is part of every checkpoint, which makes resume
exact.

Fitness is computed on train by the batched population kernel; the hall of
fame is scored on valid and the champion is the hall-of-fame member with the
best valid fitness (ties: smaller, then older). Test is never looked at here.

The operators are DEAP's, and a run makes exactly the draws and choices a
plain DEAP loop with them makes (benchmarks/deap_reference.py walks the same
trajectory). What is done differently is done faster with the same outcome,
each tested against DEAP (tests/test_selection.py, tests/test_vary.py): on
synthetic data the population is kept as arrays and selection and variation
run compiled on CPython's own random stream (evolve.selection, evolve.vary),
fitness is cached by tree hash, and the hall of fame is fed from arrays; on
trace data (the constant-scaling mutation, NSGA-II) and wherever the stream
cannot be reproduced, DEAP's own operators run on DEAP trees, with the size
and height limits snapshotting parents instead of deep-copying them.
"""

from __future__ import annotations

import functools
import gc
import math
import random
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields

import numpy as np

from evolve import fitness as F
from evolve import primitives as P
from evolve import treeio

# Baselines expressed in the primitive language, for --seed-baselines.
SEED_TREES = {
    "standard_rejection": "pmin(1.0, pdiv(target_prob, draft_prob))",
    "always_accept": "pmax(1.0, 1.0)",
    "conservative": "ite(lt(target_prob, draft_prob), 0.0, 1.0)",
    "top_token_match": "ite(top_token_match, 0.95, pmin(1.0, pdiv(target_prob, draft_prob)))",
    "ratio_floor_0.3": "pmax(pmin(1.0, pdiv(target_prob, draft_prob)), 0.3)",
    "position_aware": "pmin(1.0, mul(pmin(1.0, pdiv(target_prob, draft_prob)), "
                      "add(1.0, pdiv(pmin(position, 50.0), 100.0))))",
    "entropy_aware": "pmin(1.0, mul(pmin(1.0, pdiv(target_prob, draft_prob)), sub(1.0, "
                     "mul(0.5, pmin(1.0, pdiv(pdiv(add(draft_entropy, target_entropy), 2.0), "
                     "10.0))))))",
    "leniency_0.5": "pmin(1.0, pdiv(target_prob, mul(0.5, draft_prob)))",
}

# Lenient rules on trace features, added to --seed-baselines on trace data.
TRACE_SEED_TREES = {
    "ears_0.3": "pmin(1.0, add(pdiv(target_prob, draft_prob), mul(0.3, sub(1.0, p_max))))",
    "ears_0.1": "pmin(1.0, add(pdiv(target_prob, draft_prob), mul(0.1, sub(1.0, p_max))))",
    "leniency_0.9": "pmin(1.0, pdiv(target_prob, mul(0.9, draft_prob)))",
}


class ConfigError(ValueError):
    """A configuration value out of range; the message names option and value."""


@dataclass
class Config:
    generations: int = 100
    population: int = 1000
    seed: int = 0
    objective: str = "expected"
    tournament: int = 7
    parsimony: float = 1.4
    cx_prob: float = 0.7
    mut_prob: float = 0.25
    max_height: int = 10
    max_size: int = 60
    init_min_height: int = 1
    init_max_height: int = 4
    elitism: int = 2
    hof_size: int = 20
    seed_baselines: bool = False
    tv_budget: float = 0.02     # objective "speed": mean TV per token allowed
    threads: int = 0            # 0: Numba's default (all cores)
    checkpoint_every: int = 1

    def validate(self) -> None:
        def need(cond, option, value, what):
            if not cond:
                raise ConfigError(f"--{option.replace('_', '-')}: {value!r} is invalid; {what}")
        need(isinstance(self.generations, int) and self.generations >= 1, "generations",
             self.generations, "expected a whole number >= 1")
        need(isinstance(self.population, int) and 2 <= self.population <= MAX_POPULATION,
             "population", self.population, f"expected a whole number 2..{MAX_POPULATION}")
        need(self.objective in F.OBJECTIVES, "objective", self.objective,
             f"expected one of {', '.join(F.OBJECTIVES)}")
        need(0.0 <= self.tv_budget <= 1.0, "budget_tv", self.tv_budget,
             "expected a TV per token in [0, 1]")
        need(self.objective != "pareto" or self.population % 4 == 0, "population",
             self.population, "objective pareto (NSGA-II) needs a multiple of 4")
        need(1 <= self.tournament <= self.population, "tournament", self.tournament,
             f"expected 1..population ({self.population})")
        need(1.0 <= self.parsimony <= 2.0, "parsimony", self.parsimony, "expected 1.0..2.0")
        for name in ("cx_prob", "mut_prob"):
            v = getattr(self, name)
            need(0.0 <= v <= 1.0, name, v, "expected a probability in [0, 1]")
        need(self.cx_prob + self.mut_prob <= 1.0, "mut_prob", self.mut_prob,
             f"cx-prob + mut-prob must be <= 1 (cx-prob is {self.cx_prob})")
        need(2 <= self.max_height <= 30, "max_height", self.max_height, "expected 2..30")
        need(3 <= self.max_size <= 1000, "max_size", self.max_size, "expected 3..1000")
        need(1 <= self.init_min_height <= self.init_max_height, "init_min_height",
             self.init_min_height, f"expected 1..init-max-height ({self.init_max_height})")
        need(self.init_max_height <= self.max_height, "init_max_height", self.init_max_height,
             f"expected <= max-height ({self.max_height})")
        need(0 <= self.elitism < self.population, "elitism", self.elitism,
             f"expected 0..population-1 ({self.population - 1})")
        need(1 <= self.hof_size <= 1000, "hof_size", self.hof_size, "expected 1..1000")
        need(self.threads >= 0, "threads", self.threads, "expected >= 0 (0 = all cores)")
        need(self.checkpoint_every >= 1, "checkpoint_every", self.checkpoint_every,
             "expected >= 1")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """A Config from a run's config.json; every value is type-checked first."""
        if not isinstance(d, dict):
            raise ConfigError(f"config: expected an object, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known, key=str)
        if unknown:
            raise ConfigError(f"config: unknown key {_short(repr(unknown[0]))}")
        defaults = cls()
        for key, value in d.items():
            want = type(getattr(defaults, key))
            if want is bool:
                ok = isinstance(value, bool)
            elif want is int:
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif want is float:
                ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
                      and math.isfinite(value))
            else:
                ok = isinstance(value, want)
            if not ok:
                raise ConfigError(f"config: {key!r} is {_short(repr(value))}; expected "
                                  f"{'a finite number' if want is float else want.__name__}")
        cfg = cls(**d)
        cfg.validate()
        return cfg


MAX_POPULATION = 1_000_000


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


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


# ------------------------------------------------------------- individuals

def _make_classes(weights):
    from deap import base, gp

    class Fitness(base.Fitness):
        pass
    Fitness.weights = weights

    class Individual(gp.PrimitiveTree):
        text = None     # str(self) while the fitness is valid (see _text)

        def __init__(self, content=()):
            super().__init__(content)
            self.fitness = Fitness()
            self.born = 0

    return Fitness, Individual


FitnessMax, Individual = _make_classes((1.0,))
# objective "pareto": (tokens per call, TV per token), the first maximised
FitnessPareto, ParetoIndividual = _make_classes((1.0, -1.0))


@dataclass
class HofEntry:
    tree: str
    fitness: float
    size: int
    born: int


class HallOfFame:
    """The best distinct trees seen on train (by tree text), best first."""

    def __init__(self, size: int):
        self.size = size
        self.entries: list[HofEntry] = []

    @staticmethod
    def _key(e: HofEntry):
        return (-e.fitness, e.size, e.born, e.tree)

    def update(self, texts: list[str], fits, sizes, borns) -> None:
        """Add the best of a population given as parallel sequences (tree text,
        fitness, size, generation born), in population order: an individual
        whose tree is already in enters no more; the first of equal trees wins."""
        candidates = range(len(texts))
        if len(self.entries) >= self.size:
            # the bar only rises while the hall is full: whoever is below it now
            # cannot enter, so only the others are looked at one by one
            candidates = np.flatnonzero(np.asarray(fits) >= self.entries[-1].fitness).tolist()
        have = {e.tree: e for e in self.entries}
        for i in candidates:
            s = texts[i]
            if s in have:
                continue
            e = HofEntry(s, float(fits[i]), int(sizes[i]), int(borns[i]))
            if len(self.entries) >= self.size and self._key(e) >= self._key(self.entries[-1]):
                continue
            have[s] = e
            self.entries.append(e)
            self.entries.sort(key=self._key)
            if len(self.entries) > self.size:
                dropped = self.entries.pop()
                have.pop(dropped.tree, None)

    def add(self, entries) -> None:
        """Merge entries (e.g. scored on valid), keeping the best ``size`` distinct trees."""
        have = {e.tree for e in self.entries}
        self.entries.extend(e for e in entries if e.tree not in have)
        self.entries.sort(key=self._key)
        del self.entries[self.size:]

    def to_json(self) -> list[dict]:
        return [asdict(e) for e in self.entries]

    @classmethod
    def from_json(cls, size: int, data: list[dict]) -> "HallOfFame":
        hof = cls(size)
        for d in data:
            treeio.parse(d["tree"])
            hof.entries.append(HofEntry(str(d["tree"]), float(d["fitness"]), int(d["size"]),
                                        int(d["born"])))
        hof.entries.sort(key=cls._key)
        return hof


# ----------------------------------------------------------------- engine

class Evaluator:
    """Scores trees on one split with the population kernel, caching by tree text."""

    CACHE_LIMIT = 100_000

    def __init__(self, split, name: str):
        from evolve.kernels import SplitArrays
        self.name = name
        self.arrays = SplitArrays(split)
        self.n = self.arrays.n
        self.rows_per_program = self.n
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.kernel_seconds = 0.0
        self.kernel_programs = 0
        self.node_evals = 0

    def _kernel(self, programs) -> np.ndarray:
        from evolve.kernels import population_counts
        return population_counts(programs, self.arrays)

    def run(self, progs) -> np.ndarray:
        """Kernel rows for linearised programs (not cached), timed and counted."""
        t0 = time.perf_counter()
        rows = self._kernel(progs)
        self.kernel_seconds += time.perf_counter() - t0
        self.kernel_programs += len(progs)
        self.node_evals += int(progs.lengths.sum()) * self.rows_per_program
        return rows

    def counts(self, trees: list[str], deap_trees: list | None = None) -> np.ndarray:
        """Kernel result rows for tree strings, computing only the unknown
        (``deap_trees``: the same trees as DEAP individuals, read instead of
        parsing the strings)."""
        todo: dict[str, int] = {}
        cache = self.cache
        for i, s in enumerate(trees):
            if s not in cache and s not in todo:
                todo[s] = i
        if todo:
            node_lists = [treeio.from_deap(deap_trees[i]) if deap_trees is not None
                          else treeio.parse(s) for s, i in todo.items()]
            rows = self.run(treeio.linearise(node_lists))
            for j, s in enumerate(todo):
                cache[s] = rows[j].copy()
        out = np.stack([cache[s] for s in trees]) if trees else np.empty((0, 0))
        # forget the oldest only now: more new trees than the limit are still answered
        while len(cache) > self.CACHE_LIMIT:
            cache.popitem(last=False)
        return out

    def fitness(self, objective: str, trees: list[str], deap_trees=None) -> np.ndarray:
        return np.atleast_1d(F.objective_fitness(objective, self.n,
                                                 self.counts(trees, deap_trees)))


class TraceEvaluator(Evaluator):
    """Scores trees on a speculative-decoding trace split (schema v2): exact
    tokens per target call and TV per token from the draft's top-k candidates."""

    def __init__(self, split, name: str, tv_budget: float):
        from evolve.spec import SpecArrays
        self.name = name
        self.sa = SpecArrays.from_split(split)
        self.n = self.sa.n
        self.rows_per_program = self.sa.n * self.sa.k
        self.tv_budget = tv_budget
        self.cache = OrderedDict()
        self.kernel_seconds = 0.0
        self.kernel_programs = 0
        self.node_evals = 0

    def _kernel(self, programs) -> np.ndarray:
        from evolve.spec_kernels import population_objectives
        return population_objectives(programs, self.sa, with_kl=False)

    def tokens_tv(self, trees: list[str], deap_trees=None) -> tuple[np.ndarray, np.ndarray]:
        sums = self.counts(trees, deap_trees)
        return sums[:, 0] / self.sa.n_blocks, sums[:, 1] / sums[:, 0]

    def fitness(self, objective: str, trees: list[str], deap_trees=None) -> np.ndarray:
        tokens, tv = self.tokens_tv(trees, deap_trees)
        return np.atleast_1d(F.speed_fitness(tokens, tv, self.tv_budget))


class Evolution:
    def __init__(self, config: Config, train, valid, arrays: bool = True):
        """``arrays``: on synthetic data, keep the population as arrays and run
        variation compiled (evolve.vary; same draws and trees as DEAP's
        operators) where this interpreter allows; False: always DEAP's."""
        config.validate()
        self.config = config
        self.trace = config.objective in F.TRACE_OBJECTIVES
        self.pareto = config.objective == "pareto"
        self.Individual = ParetoIndividual if self.pareto else Individual
        self.pset = P.make_pset(trace=self.trace)
        if self.trace:
            self.train = TraceEvaluator(train, "train", config.tv_budget)
            self.valid = TraceEvaluator(valid, "valid", config.tv_budget)
        else:
            self.train = Evaluator(train, "train")
            self.valid = Evaluator(valid, "valid")
        self._rng = random.Random(config.seed)
        # array mode: the generator state as arrays the compiled loops advance
        # (None: not loaded), put back into self._rng when something reads
        # it (the rng property, _sync_rng); DEAP code changing it drops them
        self._mt = None
        self._rng_behind = False
        self.generation = -1
        self._population: list = []
        self.hof = HallOfFame(config.hof_size)
        self.valid_hof = HallOfFame(config.hof_size)
        # train fitness by tree text, weighted as DEAP stores it (wvalues): a tree
        # met again is not looked up, stacked and scored again
        self._known: dict[str, tuple] = {}
        self.toolbox = self._toolbox()
        # array mode (evolve.vary): the population as arrays, a fitness cache by
        # tree hash, and tree texts by hash for the hall of fame and checkpoints
        self._table = None
        if arrays and not self.trace and not self.pareto:
            from evolve import selection, vary
            if selection.stream_matches() and vary.stream_matches():
                self._table = vary.Table.build(self.pset)
        if self._table is not None:
            self._pop = None
            self._cache = vary.FitnessCache(Evaluator.CACHE_LIMIT)
            self._texts: dict = {}
            self._deap_view = None
            self._work = vary.Workspace()
        if config.threads:
            import numba
            numba.set_num_threads(min(config.threads, numba.config.NUMBA_NUM_THREADS))

    @property
    def arrays(self) -> bool:
        """Whether the population is kept as arrays (evolve.vary)."""
        return self._table is not None

    @property
    def population(self) -> list:
        """The population as DEAP individuals (built on demand in array mode)."""
        if self._table is None:
            return self._population
        if self._deap_view is None:
            from evolve import vary
            pop = self._pop
            self._deap_view = [] if pop is None else \
                [vary.to_deap(self._table, pop, i, self.Individual) for i in range(len(pop))]
        return self._deap_view

    # --- randomness -----------------------------------------------------
    @contextmanager
    def _random(self):
        """Run DEAP code with the engine's RNG state in the random module."""
        self._sync_rng()
        outer = random.getstate()
        random.setstate(self._rng.getstate())
        try:
            yield
        finally:
            self._rng.setstate(random.getstate())
            random.setstate(outer)
            self._mt = None

    @property
    def rng(self) -> random.Random:
        """The engine's random generator, current."""
        self._sync_rng()
        return self._rng

    def _sync_rng(self) -> None:
        """Make ``self._rng`` current after the compiled loops advanced its state."""
        if self._rng_behind:
            from evolve import stream
            stream.set_state(self._rng, self._mt, self._pos, *self._rng_meta)
            self._rng_behind = False

    # --- DEAP toolbox ---------------------------------------------------
    def _toolbox(self):
        from deap import base, gp, tools

        c = self.config
        tb = base.Toolbox()
        tb.register("expr", gp.genHalfAndHalf, pset=self.pset,
                    min_=c.init_min_height, max_=c.init_max_height)
        tb.register("select", tools.selDoubleTournament, fitness_size=c.tournament,
                    parsimony_size=c.parsimony, fitness_first=True)
        tb.register("mate", gp.cxOnePoint)
        tb.register("expr_mut", gp.genFull, min_=0, max_=2)
        tb.register("mutate", self._mutate)
        for name in ("mate", "mutate"):
            tb.decorate(name, _static_limit(c.max_height, c.max_size))
        tb.register("clone", _clone)
        return tb

    def _mutate(self, ind):
        from deap import gp
        r = random.random()
        if r < 0.5:
            return gp.mutUniform(ind, expr=self.toolbox.expr_mut, pset=self.pset)
        if r < 0.7:
            return gp.mutNodeReplacement(ind, pset=self.pset)
        if r < 0.85:
            return gp.mutShrink(ind)
        if self.trace and r < 0.95:
            return _mut_scale_constant(ind)
        return gp.mutEphemeral(ind, mode="one")

    # --- evaluation ----------------------------------------------------
    def _evaluate(self, individuals) -> tuple[int, int]:
        """Set train fitness on individuals whose fitness is invalid; return how
        many there were and how many distinct trees among them."""
        todo = [ind for ind in individuals if not ind.fitness.wvalues]
        if not todo:
            return 0, 0
        strings = [str(ind) for ind in todo]
        known = self._known
        new: dict[str, int] = {}
        for i, s in enumerate(strings):
            if s not in known and s not in new:
                new[s] = i
        if new:
            trees = list(new)
            deap_trees = [todo[i] for i in new.values()]
            if self.pareto:
                tokens, tv = self.train.tokens_tv(trees, deap_trees)
                values = [(float(a), float(b)) for a, b in zip(tokens, tv)]
            else:
                fit = self.train.fitness(self.config.objective, trees, deap_trees)
                values = [(float(f),) for f in fit]
            weights = todo[0].fitness.weights
            fresh = {s: tuple(x * w for x, w in zip(v, weights)) for s, v in zip(trees, values)}
            known.update(fresh)
            while len(known) > Evaluator.CACHE_LIMIT:
                del known[next(iter(known))]
        else:
            fresh = {}
        for ind, s in zip(todo, strings):
            # a generation with more new trees than the cache holds: from ``fresh``
            ind.fitness.wvalues = fresh[s] if s in fresh else known[s]
            ind.text = s
        return len(todo), len(set(strings))

    def _evaluate_arrays(self, pop) -> tuple[int, int]:
        """``_evaluate`` for a vary.Population: the cache by tree hash, then the
        kernel on each distinct new tree."""
        from evolve import vary

        def score(new):
            rows = self.train.run(vary.programs(self._table, pop, new))
            return F.objective_fitness(self.config.objective, self.train.n, rows)
        return self._cache.evaluate(pop, score)

    def _texts_of(self, idx) -> list[str]:
        """Tree texts of individuals ``idx`` of the array population, remembered
        by tree hash."""
        from evolve import vary
        pop, memo = self._pop, self._texts
        idx = np.asarray(idx, dtype=np.int64)
        out = []
        for i, a, b in zip(idx.tolist(), pop.h1[idx].tolist(), pop.h2[idx].tolist()):
            s = memo.get((a, b))
            if s is None:
                if len(memo) >= Evaluator.CACHE_LIMIT:
                    memo.clear()
                s = memo[(a, b)] = vary.text(self._table, pop, i)
            out.append(s)
        return out

    def scores(self, pop) -> np.ndarray:
        """One number per individual for the hall of fame, elites and history: its
        fitness, or for "pareto" the speed objective at the run's TV budget."""
        if self.pareto:
            v = np.array([ind.fitness.values for ind in pop], dtype=np.float64).reshape(-1, 2)
            return np.asarray(F.speed_fitness(v[:, 0], v[:, 1], self.config.tv_budget),
                              dtype=np.float64)
        return np.array([ind.fitness.wvalues[0] for ind in pop], dtype=np.float64)  # weight 1

    def _adopt(self, pop) -> None:
        """Make ``pop`` the population, with the score and size arrays that
        elitism and the next selection read."""
        if self._table is not None:
            self._pop, self._deap_view = pop, None
            self._scores, self._sizes = pop.fit, pop.lens
            return
        self._population = pop
        self._scores = self.scores(pop)
        self._sizes = np.fromiter(map(len, pop), dtype=np.int64, count=len(pop))

    def valid_scores(self, trees: list[str]) -> np.ndarray:
        return self.valid.fitness(self.config.objective, trees)

    # --- the loop -------------------------------------------------------
    def initialise(self) -> dict:
        c = self.config
        t0 = time.perf_counter()
        with self._random():
            pop = []
            if c.seed_baselines:
                seeds = {**SEED_TREES, **TRACE_SEED_TREES} if self.trace else SEED_TREES
                for text in seeds.values():
                    if len(pop) < c.population:
                        pop.append(treeio.deap_from_string(text, self.pset, self.Individual))
            while len(pop) < c.population:
                pop.append(self.Individual(self.toolbox.expr()))
        for ind in pop:
            ind.born = 0
        if self._table is not None:
            from evolve import vary
            pop = vary.from_deap(self._table, pop)
        self.generation = 0
        parts = {"variation": time.perf_counter() - t0}
        if self.pareto:
            from deap import tools
            stats = self._timed(parts, "evaluation", self._evaluate, pop)
            pop = self._timed(parts, "selection", tools.selNSGA2, pop, c.population)
            return self._finish_generation(pop, t0, stats, parts)
        return self._finish_generation(pop, t0, None, parts)

    @staticmethod
    def _timed(parts: dict, name: str, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            parts[name] = parts.get(name, 0.0) + time.perf_counter() - t

    def _select(self, k: int) -> list:
        """``toolbox.select`` (DEAP's double tournament) on the population: the same
        individuals from the same random draws, computed over arrays where this
        interpreter's random stream allows (evolve.selection)."""
        from evolve import selection
        c, pop = self.config, self.population
        if not selection.stream_matches():
            return self.toolbox.select(pop, k)
        # single objective, weight 1: the scores are DEAP's weighted fitness values
        idx = selection.double_tournament(random, self._scores, self._sizes, k,
                                          c.tournament, c.parsimony)
        return [pop[i] for i in idx]

    def _step_pareto(self, t0) -> dict:
        """NSGA-II: crowded tournaments for parents, then the best ``population`` of
        parents + offspring by non-domination rank and crowding distance."""
        from deap import algorithms, tools
        c = self.config
        parts: dict = {}
        with self._random():
            chosen = self._timed(parts, "selection", tools.selTournamentDCD,
                                 self.population, c.population)
            offspring = self._timed(parts, "variation", algorithms.varAnd, chosen,
                                    self.toolbox, c.cx_prob, c.mut_prob)
        for ind in offspring:
            if not ind.fitness.valid:
                ind.born = self.generation
        stats = self._timed(parts, "evaluation", self._evaluate, offspring)
        pop = self._timed(parts, "selection", tools.selNSGA2, self.population + offspring,
                          c.population)
        return self._finish_generation(pop, t0, stats, parts)

    def step(self) -> dict:
        c = self.config
        t0 = time.perf_counter()
        self.generation += 1
        if self.pareto:
            return self._step_pareto(t0)
        parts: dict = {}
        n_off = c.population - c.elitism
        if self._table is not None:
            return self._step_arrays(t0, n_off, parts)
        from deap import algorithms
        with self._random():
            chosen = self._timed(parts, "selection", self._select, n_off)
            offspring = self._timed(parts, "variation", algorithms.varAnd, chosen,
                                    self.toolbox, c.cx_prob, c.mut_prob)
        t = time.perf_counter()
        for ind in offspring:
            if not ind.fitness.wvalues:
                ind.born = self.generation
        # the best by score, then size; a stable sort keeps population order on ties
        order = np.lexsort((self._sizes, -self._scores))[:c.elitism]
        offspring.extend(_clone(self.population[i]) for i in order)
        parts["variation"] += time.perf_counter() - t
        return self._finish_generation(offspring, t0, None, parts)

    def _step_arrays(self, t0, n_off: int, parts: dict) -> dict:
        """``step`` on the array population: the same selection, variation and
        elitism, compiled (evolve.selection, evolve.vary), drawing from the
        engine's generator state as DEAP would."""
        from evolve import selection, stream, vary
        c = self.config
        t = time.perf_counter()
        if self._mt is None:
            self._mt, self._pos, *self._rng_meta = stream.state_arrays(self._rng)
        mt, pos = self._mt, self._pos
        self._rng_behind = True
        chosen = selection.tournament(mt, pos, self._scores, self._sizes, n_off,
                                      c.tournament, c.parsimony)
        t1 = time.perf_counter()
        order = np.lexsort((self._sizes, -self._scores))[:c.elitism]
        pop = vary.vary(self._table, self._pop, chosen, order, mt, pos, c.cx_prob,
                        c.mut_prob, c.max_height, c.max_size, self.generation, self._work)
        parts["selection"] = t1 - t
        parts["variation"] = time.perf_counter() - t1
        return self._finish_generation(pop, t0, None, parts)

    def _finish_generation(self, pop, t0, stats, parts: dict) -> dict:
        """Evaluate what is new in ``pop`` (stats: (new, unique new) when the caller
        evaluated already), then hall of fame, valid scores and the history record."""
        k0, p0, n0 = self.train.kernel_seconds, self.train.kernel_programs, self.train.node_evals
        v0 = self.valid.kernel_seconds
        if stats is None:
            stats = self._timed(parts, "evaluation", self._evaluate_arrays
                                if self._table is not None else self._evaluate, pop)
        n_new, unique = stats
        t = time.perf_counter()
        self._adopt(pop)
        scores, sizes = self._scores, self._sizes
        best = int(np.argmax(scores))
        if self._table is not None:
            from evolve import vary
            cand = np.arange(len(pop))
            if len(self.hof.entries) >= self.hof.size:
                cand = np.flatnonzero(scores >= self.hof.entries[-1].fitness)
            # an equal tree born in the same generation fares as the first one did
            cand = vary.first_each(pop, cand)
            self.hof.update(self._texts_of(cand), scores[cand], sizes[cand], pop.born[cand])
            best_tree = self._texts_of([best])[0]
        else:
            texts = [_text(ind) for ind in pop]
            self.hof.update(texts, scores, sizes, [ind.born for ind in pop])
            best_tree = texts[best]
        hof_trees = [e.tree for e in self.hof.entries]
        valid_fit = self.valid_scores(hof_trees)
        # the best trees ever seen on valid, from each generation's hall of fame: the
        # champion comes from here, so a good tree is not lost when train-better
        # (perhaps overfitted) trees push it out of the hall of fame
        self.valid_hof.add(HofEntry(e.tree, float(v), e.size, e.born)
                           for e, v in zip(self.hof.entries, valid_fit))
        parts["hall_of_fame"] = time.perf_counter() - t
        elapsed = time.perf_counter() - t0
        kernel = self.train.kernel_seconds - k0
        record = {
            "generation": self.generation,
            "evaluated": n_new,
            "unique": unique,
            "best_train": float(scores[best]),
            "median_train": float(np.median(scores)),
            "best_valid": self.valid_hof.entries[0].fitness,
            "mean_size": float(sizes.mean()),
            "max_size": int(sizes.max()),
            "best_tree": best_tree,
            "timing": {
                "seconds": elapsed,
                "kernel_seconds": kernel,
                "valid_kernel_seconds": self.valid.kernel_seconds - v0,
                "kernel_programs": self.train.kernel_programs - p0,
                "node_evals_per_s": ((self.train.node_evals - n0) / kernel) if kernel > 0 else 0.0,
                "evals_per_s": (n_new / elapsed) if elapsed > 0 else 0.0,
                # wall time by stage (kernels included in evaluation and hall_of_fame)
                "parts": {k: parts.get(k, 0.0) for k in
                          ("selection", "variation", "evaluation", "hall_of_fame")},
            },
        }
        return record

    def champion(self) -> HofEntry:
        """The tree with the best valid fitness among every generation's hall of fame
        (ties: smaller, older); its ``fitness`` is its train fitness."""
        best = self.valid_hof.entries[0]
        train = float(self.train.fitness(self.config.objective, [best.tree])[0])
        return HofEntry(best.tree, train, best.size, best.born)

    # --- checkpoints ----------------------------------------------------
    def state(self) -> dict:
        self._sync_rng()
        version, internal, gauss = self._rng.getstate()
        return {
            "format": "evolve-checkpoint",
            "version": 1,
            "generation": self.generation,
            "config": self.config.to_dict(),
            "random_state": [version, list(internal), gauss],
            "population": self._items(),
            "hall_of_fame": self.hof.to_json(),
            "valid_hall_of_fame": self.valid_hof.to_json(),
        }

    def _items(self) -> list[dict]:
        if self._table is None:
            return [self._item(ind) for ind in self._population]
        pop = self._pop
        texts = self._texts_of(np.arange(len(pop)))
        return [{"tree": s, "fitness": f, "born": b}
                for s, f, b in zip(texts, pop.fit.tolist(), pop.born.tolist())]

    def _item(self, ind) -> dict:
        if not self.pareto:
            return {"tree": _text(ind), "fitness": ind.fitness.values[0], "born": ind.born}
        cd = getattr(ind.fitness, "crowding_dist", None)
        return {"tree": _text(ind), "fitness": list(ind.fitness.values), "born": ind.born,
                # NSGA-II's crowding distance (None: infinite), needed by the next
                # generation's tournaments, so a resume continues exactly
                "crowding": None if cd is None or math.isinf(cd) else float(cd)}

    def restore(self, state: dict) -> None:
        """Continue from ``state()`` output (e.g. read back from checkpoint.json).

        Every field is type- and range-checked and every tree is parsed against
        the primitive table (nothing is evaluated); anything malformed raises
        ValueError (or treeio.TreeError) naming the field, and leaves the engine
        untouched.
        """
        rng_state, generation = _check_state(state, self.config)
        pop = []
        for item in state["population"]:
            ind = treeio.deap_from_string(item["tree"], self.pset, self.Individual)
            if self.pareto:
                ind.fitness.values = tuple(float(v) for v in item["fitness"])
                cd = item.get("crowding")
                ind.fitness.crowding_dist = math.inf if cd is None else float(cd)
            else:
                ind.fitness.values = (float(item["fitness"]),)
            ind.born = int(item["born"])
            pop.append(ind)
        hof = HallOfFame.from_json(self.config.hof_size, state["hall_of_fame"])
        if "valid_hall_of_fame" in state:
            _check_entries("valid_hall_of_fame", state["valid_hall_of_fame"], generation,
                           self.config.hof_size)
            valid_hof = HallOfFame.from_json(self.config.hof_size, state["valid_hall_of_fame"])
        else:   # a checkpoint from before the valid hall of fame: start it from the hall of fame
            valid_hof = HallOfFame(self.config.hof_size)
            vf = self.valid_scores([e.tree for e in hof.entries])
            valid_hof.add(HofEntry(e.tree, float(v), e.size, e.born)
                          for e, v in zip(hof.entries, vf))
        if self._table is not None:
            from evolve import vary
            pop = vary.from_deap(self._table, pop, [ind.fitness.wvalues[0] for ind in pop],
                                 [ind.born for ind in pop])
        self._rng.setstate(rng_state)
        self._mt, self._rng_behind = None, False
        self._adopt(pop)
        self.hof = hof
        self.valid_hof = valid_hof
        self.generation = generation


def _static_limit(max_height: int, max_size: int):
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


def _choice_index(n: int) -> int:
    """The index ``random.choice(seq)`` picks for a sequence of length n (same draws)."""
    return random.choice(range(n))


def _from_snapshot(cls, nodes, wvalues, born):
    new = cls(nodes)
    new.fitness.wvalues = wvalues
    new.born = born
    return new


def _clone(ind):
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


def _text(ind) -> str:
    """``str(ind)``, remembered while the fitness is valid: every operator that
    changes a tree in place is followed by invalidating its fitness (varAnd)."""
    if ind.fitness.wvalues and ind.text is not None:
        return ind.text
    s = str(ind)
    if ind.fitness.wvalues:
        ind.text = s
    return s


def _mut_scale_constant(ind):
    """Scale one constant by exp(N(0, 0.1)): fine-tunes a rule's parameters (trace
    runs, where the budget makes small parameter changes matter)."""
    from deap import gp
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


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _check_state(state, config: Config):
    """Validate a checkpoint's structure; returns (random state tuple, generation)."""
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint must be an object, got {type(state).__name__}")
    generation = state.get("generation")
    if not _is_int(generation) or generation < 0:
        raise ValueError(f"field 'generation' must be a whole number >= 0, "
                         f"got {_short(repr(generation))}")
    rs = state.get("random_state")
    if not (isinstance(rs, list) and len(rs) == 3 and _is_int(rs[0])
            and isinstance(rs[1], list) and all(_is_int(x) and 0 <= x < 2 ** 32 for x in rs[1])
            and (rs[2] is None or _is_number(rs[2]))):
        raise ValueError("field 'random_state' is not a random-module state "
                         "[version, [ints], gauss]")
    rng_state = (rs[0], tuple(rs[1]), None if rs[2] is None else float(rs[2]))
    try:
        random.Random().setstate(rng_state)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"field 'random_state' is not a valid state ({e})") from None
    pop = state.get("population")
    if not isinstance(pop, list) or len(pop) != config.population:
        got = f"{len(pop)} individuals" if isinstance(pop, list) else type(pop).__name__
        raise ValueError(f"field 'population' must hold {config.population} individuals "
                         f"(the config's population), got {got}")
    hof = state.get("hall_of_fame")
    if not isinstance(hof, list) or not 1 <= len(hof) <= config.hof_size:
        got = f"{len(hof)} entries" if isinstance(hof, list) else type(hof).__name__
        raise ValueError(f"field 'hall_of_fame' must hold 1..{config.hof_size} entries, "
                         f"got {got}")
    _check_entries("population", pop, generation)
    _check_entries("hall_of_fame", hof, generation)
    return rng_state, generation


def _check_entries(field: str, items, generation: int, limit: int | None = None) -> None:
    """Population items (tree, fitness, born) or hall-of-fame entries (also size)."""
    if limit is not None and (not isinstance(items, list) or len(items) > limit):
        raise ValueError(f"field '{field}' must be a list of at most {limit} entries")
    hof_like = field != "population"
    for i, item in enumerate(items):
        keys = ("tree", "fitness", "born") + (("size",) if hof_like else ())
        if not isinstance(item, dict) or any(k not in item for k in keys):
            raise ValueError(f"field '{field}' item {i}: expected an object with "
                             f"{', '.join(keys)}")
        if not isinstance(item["tree"], str):
            raise ValueError(f"field '{field}' item {i}: 'tree' must be a string")
        fit = item["fitness"]
        multi = field == "population" and isinstance(fit, list)
        if not (_is_number(fit) or (multi and len(fit) == 2 and all(map(_is_number, fit)))):
            raise ValueError(f"field '{field}' item {i}: 'fitness' must be a finite "
                             f"number, got {_short(repr(item['fitness']))}")
        cd = item.get("crowding")
        if cd is not None and not _is_number(cd):
            raise ValueError(f"field '{field}' item {i}: 'crowding' must be a finite number "
                             f"or null, got {_short(repr(cd))}")
        if not _is_int(item["born"]) or not 0 <= item["born"] <= generation:
            raise ValueError(f"field '{field}' item {i}: 'born' must be a generation "
                             f"0..{generation}, got {_short(repr(item['born']))}")
        if hof_like and (not _is_int(item["size"]) or
                         item["size"] != len(treeio.parse(item["tree"]))):
            raise ValueError(f"field '{field}' item {i}: 'size' is not the tree's node count")
