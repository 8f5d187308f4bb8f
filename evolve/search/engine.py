"""The evolution loop on DEAP's own operators: selection, variation, bloat
control, elitism, hall of fame; NSGA-II for objectives with several values.

All randomness comes from one ``random.Random`` state owned by the engine; it
is swapped into Python's ``random`` module only while DEAP code runs (DEAP's
operators draw from the module functions), so nothing leaks between engines
or into the caller. The state is part of every checkpoint, which makes resume
exact.

Fitness is computed on train by the objective's batched population kernel
(each distinct tree once; trees met before come from a cache keyed by tree
text); the hall of fame is scored on valid and the champion is the best tree
on valid among every generation's hall of fame (ties: smaller, then older).
Test is never looked at here.

A run makes exactly the draws and choices a plain DEAP loop with the same
operators makes (benchmarks/speed/deap_reference.py walks the same trajectory).
"""

from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager

import numpy as np

from evolve.lang import primitives as P
from evolve.lang import treeio
from evolve.objectives import bind
from evolve.rules.table import seed_trees
from evolve.search import batches, checkpoint, operators
from evolve.search.config import Config, ConfigError
from evolve.search.hof import HallOfFame, HofEntry
import numba

PARTS = ("selection", "variation", "evaluation", "hall_of_fame")


class Evolution:
    def __init__(self, config: Config, train, valid):
        """An engine on ``train`` and ``valid`` with ``config``, already validated (a run
        validates its configuration once: ``evolve.runs.lifecycle``)."""
        self.config = config
        self.objective = bind(config)       # chosen once: the trajectory estimate too
        self.Individual = operators.individual_class(self.objective.weights)
        self.train = self.objective.evaluator(train, "train", config)
        self.valid = self.objective.evaluator(valid, "valid", config)
        # the slot inputs only where both splits have them: every trace split's shape
        # says why it lacks them ("" when it has them; evolve.objectives.spec.TraceArrays)
        missing = ([e.arrays.missing for e in (self.train, self.valid)]
                   if self.objective.trace_inputs else ["token splits have no slot features"])
        if config.lookahead and any(missing):
            why = next(m for m in missing if m)
            raise ConfigError.of("lookahead", "the lookahead inputs are computed from the slot "
                                 "features, which these traces lack"
                                 + (f" ({why})" if len(why) > 1 else ""))
        # the target's ranks only where both splits record them (schema v4)
        ranks = self.objective.trace_inputs and all(map(records_ranks, (train, valid)))
        # the token classes only where both splits carry the pair's table
        extra = tuple(self.objective.extra_groups) + (
            ("vocab",) if self.objective.trace_inputs
            and all(map(records_classes, (train, valid))) else ())
        offered = P.offered_inputs(self.objective.trace_inputs, not any(missing),
                                   config.lookahead, extra, ranks)
        only = config.input_list()
        optional = config.optional_inputs()
        absent = next((n for n in only or () if n not in offered and n not in optional), None)
        if absent is not None:
            why = next((m for m in missing if m), "")
            raise ConfigError.of("inputs", f"{absent!r} is not offered by these data (they "
                                 f"offer {', '.join(offered)})"
                                 + (f"; {why}" if absent in P.SLOT_INPUT_NAMES and why else ""))
        # the inputs this search may use, in table order (recorded in each checkpoint)
        self.inputs = tuple(n for n in offered if only is None or n in only)
        self.pset = P.make_pset(self.objective.trace_inputs, not any(missing), config.lookahead,
                                only=self.inputs, extra=extra, ranks=ranks)
        self._fit = self.train       # this generation's fitness evaluator (--batch-blocks)
        self._rng = random.Random(config.seed)
        self.generation = -1
        self.population: list = []
        self.hof = HallOfFame(config.hof_size)
        self.valid_hof = HallOfFame(config.hof_size)
        # train fitness by tree text, weighted as DEAP stores it (wvalues): a tree
        # met again is not looked up, stacked and scored again
        self._known: dict[str, tuple] = {}
        self.toolbox = self._toolbox()
        if config.threads:
            numba.set_num_threads(min(config.threads, numba.config.NUMBA_NUM_THREADS))

    # --- randomness -----------------------------------------------------
    @contextmanager
    def _random(self):
        """Run DEAP code with the engine's RNG state in the random module."""
        outer = random.getstate()
        random.setstate(self._rng.getstate())
        try:
            yield
        finally:
            self._rng.setstate(random.getstate())
            random.setstate(outer)

    @property
    def rng(self) -> random.Random:
        """The engine's random generator."""
        return self._rng

    # --- DEAP toolbox ---------------------------------------------------
    def _toolbox(self):
        from deap import base, gp, tools    # lazy: start-up (DEAP loads only where it is used)

        c = self.config
        tb = base.Toolbox()
        tb.register("expr", gp.genHalfAndHalf, pset=self.pset,
                    min_=c.init_min_height, max_=c.init_max_height)
        tb.register("select", tools.selDoubleTournament, fitness_size=c.tournament,
                    parsimony_size=c.parsimony, fitness_first=True)
        # DEAP's cxOnePoint with the node types in the primitive set's order, not a
        # set's (which differs between builds of Python; see operators.cx_one_point)
        tb.register("mate", operators.cx_one_point,
                    types=tuple(dict.fromkeys([*self.pset.primitives, *self.pset.terminals])))
        tb.register("expr_mut", gp.genFull, min_=0, max_=2)
        tb.register("mutate", self._mutate)
        for name in ("mate", "mutate"):
            tb.decorate(name, operators.static_limit(c.max_height, c.max_size))
        tb.register("clone", operators.clone)
        return tb

    def _mutate(self, ind):
        from deap import gp    # lazy: start-up (DEAP loads only where it is used)
        r = random.random()
        if r < 0.5:
            return gp.mutUniform(ind, expr=self.toolbox.expr_mut, pset=self.pset)
        if r < 0.7:
            return gp.mutNodeReplacement(ind, pset=self.pset)
        if r < 0.85:
            return gp.mutShrink(ind)
        if self.objective.trace_inputs and r < 0.95:
            return operators.mut_scale_constant(ind)
        return gp.mutEphemeral(ind, mode="one")

    # --- evaluation ----------------------------------------------------
    def _evaluate(self, individuals) -> tuple[int, int]:
        """Set train fitness on individuals whose fitness is invalid; return how
        many there were and how many distinct trees among them."""
        self._use_batch()
        todo = [ind for ind in individuals if not ind.fitness.wvalues]
        if not todo:
            return 0, 0
        strings = [str(ind) for ind in todo]
        known = self._known
        new: dict[str, int] = {}
        for i, s in enumerate(strings):
            if s not in known and s not in new:
                new[s] = i
        fresh = {}
        if new:
            trees = list(new)
            values = self.objective.values(self._fit, trees, self.config,
                                           [todo[i] for i in new.values()])
            weights = self.objective.weights
            fresh = {s: tuple(float(x) * w for x, w in zip(v, weights))
                     for s, v in zip(trees, values.tolist())}
            known.update(fresh)
            while len(known) > self.train.CACHE_LIMIT:
                del known[next(iter(known))]
        for ind, s in zip(todo, strings):
            # a generation with more new trees than the cache holds: from ``fresh``
            ind.fitness.wvalues = fresh[s] if s in fresh else known[s]
            ind.text = s
        return len(todo), len(set(strings))

    def _use_batch(self) -> None:
        """--batch-blocks: this generation's sample (see ``search.batches``); every
        individual is scored on it, none keeps a fitness from another sample."""
        n = self.config.batch_blocks
        if not n:
            return
        fit = self._fit
        if fit is not self.train:       # the last sample's kernel time counts as train's
            for a in ("kernel_seconds", "kernel_programs", "node_evals"):
                setattr(self.train, a, getattr(self.train, a) + getattr(fit, a))
        blocks = batches.sample_blocks(self.config.seed, self.generation,
                                       self.train.arrays.n_blocks, n)
        self._fit = self.train.batch(blocks)
        self._known.clear()

    def scores(self, pop) -> np.ndarray:
        """One number per individual for the hall of fame, elites and history."""
        values = np.array([ind.fitness.values for ind in pop], dtype=np.float64)
        return self.objective.scores(values.reshape(len(pop), -1), self.config)

    def _adopt(self, pop) -> None:
        """Make ``pop`` the population, with the score and size arrays that
        elitism and the next selection read."""
        self.population = pop
        self._scores = self.scores(pop)
        self._sizes = np.fromiter(map(len, pop), dtype=np.int64, count=len(pop))

    def valid_scores(self, trees: list[str]) -> np.ndarray:
        values = self.objective.values(self.valid, trees, self.config)
        return self.objective.scores(values, self.config)

    def train_scores(self, trees: list[str]) -> np.ndarray:
        values = self.objective.values(self.train, trees, self.config)
        return self.objective.scores(values, self.config)

    # --- the loop -------------------------------------------------------
    def initialise(self) -> dict:
        c = self.config
        t0, mark = time.perf_counter(), self._counters()
        with self._random():
            pop = []
            if c.seed_baselines:
                for text in seed_trees(self.objective.data, c.lookahead, c.tv_p99_cap):
                    ind = treeio.deap_from_string(text, self.pset, self.Individual)
                    # within the run's limits, like every tree the run makes
                    if len(pop) < c.population and len(ind) <= c.max_size \
                            and ind.height <= c.max_height:
                        pop.append(ind)
            while len(pop) < c.population:
                pop.append(self.Individual(self.toolbox.expr()))
        for ind in pop:
            ind.born = 0
        self.generation = 0
        parts = {"variation": time.perf_counter() - t0}
        stats = _timed(parts, "evaluation", self._evaluate, pop)
        if self.objective.multi:
            from deap import tools    # lazy: start-up (DEAP loads only where it is used)
            pop = _timed(parts, "selection", tools.selNSGA2, pop, c.population)
        return self._finish_generation(pop, t0, mark, stats, parts)

    def step(self) -> dict:
        """One generation; returns its history record. With ``initialise`` (generation
        0) and the loop that calls both (``evolve.runs.runner``: a checkpoint every
        ``checkpoint_every`` generations, a stop asked by a signal honoured between
        generations), a run is DEAP's ``eaSimple`` with elitism, in pseudo-code::

            population = evaluate(random trees [+ the baselines])         # initialise
            for generation in 1 .. generations:                           # step
                chosen    = double_tournament(population, size - elitism)
                offspring = varAnd(chosen, cx_prob, mut_prob)    # crossover, then mutation
                offspring += the elitism best of population (score, then size)
                evaluate(offspring whose fitness is invalid)     # train, by the kernel
                population = offspring
                hall_of_fame.update(population); valid_hof.add(hall_of_fame on valid)
            champion = valid_hof.best                             # the best on valid

        ``evaluate`` scores each tree text once (the others from the cache), on this
        generation's sample of train blocks with ``batch_blocks`` (then every fitness,
        the elites' included, is of this sample). With an objective of several values
        (NSGA-II), ``chosen`` are crowded tournaments (``selTournamentDCD``) of the whole
        population, there is no elitism, and the new population is the best ``size`` of
        population + offspring by ``selNSGA2``."""
        from deap import algorithms, tools    # lazy: start-up (DEAP loads only where it is used)
        c = self.config
        t0, mark = time.perf_counter(), self._counters()
        self.generation += 1
        parts: dict = {}
        if self.objective.multi:
            # NSGA-II: crowded tournaments for parents, then the best ``population`` of
            # parents + offspring by non-domination rank and crowding distance
            with self._random():
                chosen = _timed(parts, "selection", tools.selTournamentDCD,
                                self.population, c.population)
                offspring = _timed(parts, "variation", algorithms.varAnd, chosen,
                                   self.toolbox, c.cx_prob, c.mut_prob)
            self._mark_born(offspring)
            stats = _timed(parts, "evaluation", self._evaluate, offspring)
            pop = _timed(parts, "selection", tools.selNSGA2, self.population + offspring,
                         c.population)
            return self._finish_generation(pop, t0, mark, stats, parts)
        with self._random():
            chosen = _timed(parts, "selection", self.toolbox.select, self.population,
                            c.population - c.elitism)
            offspring = _timed(parts, "variation", algorithms.varAnd, chosen,
                               self.toolbox, c.cx_prob, c.mut_prob)
        t = time.perf_counter()
        self._mark_born(offspring)
        if c.batch_blocks:              # a new sample: every fitness is from this one
            for ind in offspring:
                del ind.fitness.values
        # the best by score, then size; a stable sort keeps population order on ties
        order = np.lexsort((self._sizes, -self._scores))[:c.elitism]
        elites = [operators.clone(self.population[i]) for i in order]
        if c.batch_blocks:
            for ind in elites:
                del ind.fitness.values
        offspring.extend(elites)
        parts["variation"] += time.perf_counter() - t
        stats = _timed(parts, "evaluation", self._evaluate, offspring)
        return self._finish_generation(offspring, t0, mark, stats, parts)

    def _mark_born(self, offspring) -> None:
        for ind in offspring:
            if not ind.fitness.wvalues:
                ind.born = self.generation

    def _counters(self) -> tuple:
        tr = self.train
        return tr.kernel_seconds, tr.kernel_programs, tr.node_evals, self.valid.kernel_seconds

    def _finish_generation(self, pop, t0, mark, stats, parts: dict) -> dict:
        """Hall of fame, valid scores and the history record of an evaluated ``pop``
        (``mark``: the kernel counters when the generation began)."""
        tr = self.train
        k0, p0, n0, v0 = mark
        n_new, unique = stats
        t = time.perf_counter()
        self._adopt(pop)
        scores, sizes = self._scores, self._sizes
        best = int(np.argmax(scores))
        texts = [operators.text_of(ind) for ind in pop]
        if self.config.batch_blocks:    # the sample's best, scored on the whole split
            best_i = batches.best_distinct(texts, scores, sizes, self.config.hof_size)
            trees = [texts[i] for i in best_i]
            self.hof.update(trees, self.train_scores(trees), sizes[best_i],
                            [pop[i].born for i in best_i])
        else:
            self.hof.update(texts, scores, sizes, [ind.born for ind in pop])
        hof_trees = [e.tree for e in self.hof.entries]
        valid_fit = self.valid_scores(hof_trees)
        # the best trees ever seen on valid, from each generation's hall of fame: the
        # champion comes from here, so a good tree is not lost when train-better
        # (perhaps overfitted) trees push it out of the hall of fame
        self.valid_hof.add(HofEntry(e.tree, float(v), e.size, e.born)
                           for e, v in zip(self.hof.entries, valid_fit))
        parts["hall_of_fame"] = time.perf_counter() - t
        elapsed = time.perf_counter() - t0
        kernel = tr.kernel_seconds - k0
        return {
            "generation": self.generation,
            "evaluated": n_new,
            "unique": unique,
            "best_train": float(scores[best]),
            "median_train": float(np.median(scores)),
            "best_valid": self.valid_hof.entries[0].fitness,
            "mean_size": float(sizes.mean()),
            "max_size": int(sizes.max()),
            "best_tree": texts[best],
            "timing": {
                "seconds": elapsed,
                "kernel_seconds": kernel,
                "valid_kernel_seconds": self.valid.kernel_seconds - v0,
                "kernel_programs": tr.kernel_programs - p0,
                "node_evals_per_s": ((tr.node_evals - n0) / kernel) if kernel > 0 else 0.0,
                "evals_per_s": (n_new / elapsed) if elapsed > 0 else 0.0,
                # wall time by stage (kernels included in evaluation and hall_of_fame)
                "parts": {k: parts.get(k, 0.0) for k in PARTS},
            },
        }

    def champion(self) -> HofEntry:
        """The tree with the best valid score among every generation's hall of fame
        (ties: smaller, older); its ``fitness`` is its train score."""
        best = self.valid_hof.entries[0]
        train = float(self.train_scores([best.tree])[0])
        return HofEntry(best.tree, train, best.size, best.born)

    # --- checkpoints ----------------------------------------------------
    def state(self) -> dict:
        version, internal, gauss = self._rng.getstate()
        return {
            "format": "evolve-checkpoint",
            "version": 1,
            "generation": self.generation,
            "config": self.config.to_dict(),
            "random_state": [version, list(internal), gauss],
            "population": [self._item(ind) for ind in self.population],
            "hall_of_fame": self.hof.to_json(),
            "valid_hall_of_fame": self.valid_hof.to_json(),
            "inputs": list(self.inputs),
            **({"batch": {"blocks": self.config.batch_blocks, "seed": self.config.seed,
                          "stream": batches.BATCH_STREAM, "generation": self.generation}}
               if self.config.batch_blocks else {}),
        }

    def _item(self, ind) -> dict:
        if not self.objective.multi:
            return {"tree": operators.text_of(ind), "fitness": ind.fitness.values[0],
                    "born": ind.born}
        cd = getattr(ind.fitness, "crowding_dist", None)
        return {"tree": operators.text_of(ind), "fitness": list(ind.fitness.values),
                "born": ind.born,
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
        rng_state, generation = checkpoint.check_state(state, self.config)
        if "inputs" in state and state["inputs"] != list(self.inputs):
            raise ValueError(f"field 'inputs': the run's search used {state['inputs']!r}; "
                             f"these data offer it {list(self.inputs)!r}")
        pop = []
        multi = self.objective.multi
        for item in state["population"]:
            ind = treeio.deap_from_string(item["tree"], self.pset, self.Individual)
            if multi:
                ind.fitness.values = tuple(float(v) for v in item["fitness"])
                cd = item.get("crowding")
                ind.fitness.crowding_dist = math.inf if cd is None else float(cd)
            else:
                ind.fitness.values = (float(item["fitness"]),)
            ind.born = int(item["born"])
            pop.append(ind)
        hof = HallOfFame.from_json(self.config.hof_size, state["hall_of_fame"])
        if "valid_hall_of_fame" in state:
            checkpoint.check_entries("valid_hall_of_fame", state["valid_hall_of_fame"],
                                     generation, self.config.hof_size, config=self.config)
            valid_hof = HallOfFame.from_json(self.config.hof_size, state["valid_hall_of_fame"])
        else:   # a checkpoint from before the valid hall of fame: start it from the hall of fame
            valid_hof = HallOfFame(self.config.hof_size)
            vf = self.valid_scores([e.tree for e in hof.entries])
            valid_hof.add(HofEntry(e.tree, float(v), e.size, e.born)
                          for e, v in zip(hof.entries, vf))
        self._rng.setstate(rng_state)
        self._adopt(pop)
        self.hof = hof
        self.valid_hof = valid_hof
        self.generation = generation


def _timed(parts: dict, name: str, fn, *args):
    t = time.perf_counter()
    try:
        return fn(*args)
    finally:
        parts[name] = parts.get(name, 0.0) + time.perf_counter() - t



def records_ranks(split) -> bool:
    """Whether a split (traces in memory or sharded, or task traces) gives the target's
    ranks: its columns hold them (schema v4) or its candidates hold all the mass
    (``evolve.data.inputs.rank_columns``), or a sharded split's manifest says v4."""
    from evolve.data import traces as T     # lazy: as the module's others
    from evolve.data.inputs import rank_columns   # lazy: as above
    inner = getattr(split, "traces", split)
    cols = getattr(inner, "columns", None)
    if isinstance(cols, dict):
        return rank_columns(cols) is not None
    meta = getattr(split, "meta", None) or {}
    return meta.get("format_version") == T.RANK_VERSION


def records_classes(split) -> bool:
    """Whether a split (traces in memory or sharded, or task traces) carries its pair's
    vocabulary classes (``meta["vocab_classes"]``, ``evolve.data.vocab_class``)."""
    from evolve.data import vocab_class as VC     # lazy: as the module's others
    inner = getattr(split, "traces", split)
    meta = getattr(inner, "meta", None) or getattr(split, "meta", None) or {}
    return VC.META_KEY in meta
