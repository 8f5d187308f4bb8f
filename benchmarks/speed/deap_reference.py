"""The plain DEAP way, as the reference benchmarks/speed/harness.py compares `evolve run` with.

What a DEAP user writes from the DEAP tutorials with the same ingredients as
`evolve run` (the defaults of ``evolve.search.config.Config``):

- the same data (the train split; valid only to pick the champion at the end),
- the same strongly typed primitive set (``evolve.lang.primitives.make_pset()``; its
  primitives are numpy functions, constants are Python floats),
- the same operators and limits: initial trees ``genHalfAndHalf`` heights 1-4,
  ``selDoubleTournament`` (fitness_size 7, parsimony 1.4, fitness first),
  ``cxOnePoint`` with probability 0.7 (as ``evolve run``: its node types in the
  primitive set's order, ``evolve.search.operators.cx_one_point``, since DEAP's
  set order differs between builds of Python), mutation with probability 0.25
  drawn as in ``Evolution._mutate`` (mutUniform with genFull 0-2 /
  mutNodeReplacement / mutShrink / mutEphemeral one: 50/20/15/15 %),
  ``staticLimit`` height 10 and size 60 on both, elitism 2 (the best two by fitness, then size, cloned),
- the same fitness: the expected objective (``evolve.objectives.metrics.fitness``
  of the expected counts).

Evaluation is the standard DEAP one: every individual with an invalid fitness is
compiled with ``gp.compile`` to a Python function over numpy arrays, evaluated
on the whole split, and its decisions counted with numpy
(``evolve.objectives.metrics.counts_from_thresholds``). No cache, no batching, one process:
an ``eaSimple`` loop (variation with ``algorithms.varAnd``, a HallOfFame and
Statistics per generation), written out so elitism fits in.

The random stream is consumed in the same order as ``evolve run`` does, so with
equal fitness values both walk the same trajectory; benchmarks/speed/harness.py
reports whether they did.

Prints one JSON document on stdout (progress on stderr). Usage:

    python -m benchmarks.speed.deap_reference --generations 100 --population 1000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import random
import sys
import time



import numpy as np  # noqa: E402
from deap import algorithms, base, creator, gp, tools  # noqa: E402

from evolve.data import tokens as data  # noqa: E402
from evolve.lang import primitives as P  # noqa: E402
from evolve.objectives import metrics as F  # noqa: E402
from evolve.io.paths import DATA_DIR  # noqa: E402
from evolve.search import operators  # noqa: E402

# The token objectives of `evolve run`: the seed metric on the pre-drawn
# uniforms, or its expectation (the default).
OBJECTIVES = ("expected", "seed")

# Config defaults of `evolve run` (evolve.search.config.Config), spelled out.
INIT_MIN_HEIGHT, INIT_MAX_HEIGHT = 1, 4
TOURNAMENT, PARSIMONY = 7, 1.4
CX_PROB, MUT_PROB = 0.7, 0.25
MAX_HEIGHT, MAX_SIZE = 10, 60
ELITISM = 2
HOF_SIZE = 20


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """VmHWM: this process's own high-water mark (ru_maxrss would also count the
    parent's memory between fork and exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def columns(ds) -> tuple:
    """The primitive set's inputs in order, as it types them: the integer column
    (position) as floats, like the kernel's feature matrix; bool stays bool."""
    cols = []
    for name in P.INPUT_NAMES:
        col = getattr(ds, name)
        cols.append(col.astype(np.float64) if np.issubdtype(col.dtype, np.integer) else col)
    return tuple(cols)


def make_evaluate(toolbox, ds, objective):
    cols = columns(ds)
    n = len(ds)
    rand, base_acc, std = ds.rand_value, ds.baseline_accepts, ds.standard_threshold()

    def evaluate(individual):
        func = toolbox.compile(expr=individual)
        h = np.broadcast_to(np.asarray(func(*cols), dtype=np.float64), (n,))
        c = F.counts_from_thresholds(h, rand, base_acc, std)
        if objective == "seed":
            return (float(F.fitness(n, c.accepted, c.false_accepts, c.false_rejects)),)
        return (float(F.fitness(n, c.expected_accepted, c.expected_fa, c.expected_fr)),)
    return evaluate


def build_toolbox(pset):
    if not hasattr(creator, "FitnessMax"):
        creator.create("FitnessMax", base.Fitness, weights=(1.0,))
    if not hasattr(creator, "Individual"):
        creator.create("Individual", gp.PrimitiveTree, fitness=creator.FitnessMax)
    tb = base.Toolbox()
    tb.register("expr", gp.genHalfAndHalf, pset=pset, min_=INIT_MIN_HEIGHT, max_=INIT_MAX_HEIGHT)
    tb.register("individual", tools.initIterate, creator.Individual, tb.expr)
    tb.register("population", tools.initRepeat, list, tb.individual)
    tb.register("compile", gp.compile, pset=pset)
    tb.register("select", tools.selDoubleTournament, fitness_size=TOURNAMENT,
                parsimony_size=PARSIMONY, fitness_first=True)
    tb.register("mate", operators.cx_one_point,
                types=tuple(dict.fromkeys([*pset.primitives, *pset.terminals])))
    tb.register("expr_mut", gp.genFull, min_=0, max_=2)

    def mutate(ind):
        r = random.random()
        if r < 0.5:
            return gp.mutUniform(ind, expr=tb.expr_mut, pset=pset)
        if r < 0.7:
            return gp.mutNodeReplacement(ind, pset=pset)
        if r < 0.85:
            return gp.mutShrink(ind)
        return gp.mutEphemeral(ind, mode="one")

    tb.register("mutate", mutate)
    for name in ("mate", "mutate"):
        tb.decorate(name, gp.staticLimit(key=operator.attrgetter("height"), max_value=MAX_HEIGHT))
        tb.decorate(name, gp.staticLimit(key=len, max_value=MAX_SIZE))
    return tb


def evaluate_invalid(toolbox, population) -> tuple[int, float]:
    invalid = [ind for ind in population if not ind.fitness.valid]
    t0 = time.perf_counter()
    for ind, fit in zip(invalid, toolbox.map(toolbox.evaluate, invalid)):
        ind.fitness.values = fit
    return len(invalid), time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--generations", type=int, default=100)
    ap.add_argument("--population", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=str(DATA_DIR))
    ap.add_argument("--objective", choices=OBJECTIVES, default="expected")
    args = ap.parse_args(argv)

    t_start = time.perf_counter()
    train = data.load_split(args.data, "train")
    valid = data.load_split(args.data, "valid")
    pset = P.make_pset()
    toolbox = build_toolbox(pset)
    toolbox.register("evaluate", make_evaluate(toolbox, train, args.objective))
    stats = tools.Statistics(lambda ind: ind.fitness.values[0])
    stats.register("max", np.max)
    stats.register("mean", np.mean)
    logbook = tools.Logbook()
    hof = tools.HallOfFame(HOF_SIZE)
    random.seed(args.seed)

    t_loop = time.perf_counter()
    gens = []
    t0 = time.perf_counter()
    pop = toolbox.population(n=args.population)
    for gen in range(args.generations + 1):
        if gen > 0:
            t0 = time.perf_counter()
            chosen = toolbox.select(pop, args.population - ELITISM)
            offspring = algorithms.varAnd(chosen, toolbox, CX_PROB, MUT_PROB)
            elite = sorted(pop, key=lambda i: (-i.fitness.values[0], len(i)))[:ELITISM]
            offspring.extend(toolbox.clone(e) for e in elite)
            pop = offspring
        evaluated, eval_s = evaluate_invalid(toolbox, pop)
        hof.update(pop)
        record = stats.compile(pop)
        logbook.record(gen=gen, evals=evaluated, **record)
        seconds = time.perf_counter() - t0
        gens.append({"generation": gen, "evaluated": evaluated, "seconds": seconds,
                     "eval_seconds": eval_s, "best_train": float(record["max"]),
                     "rss_mb": rss_mb()})
        if gen % 10 == 0 or gen == args.generations:
            print(f"reference gen {gen}/{args.generations} best {record['max']:.4f} "
                  f"{seconds:.2f}s", file=sys.stderr, flush=True)
    loop_s = time.perf_counter() - t_loop

    # Champion: the hall-of-fame member with the best valid fitness.
    score_valid = make_evaluate(toolbox, valid, args.objective)
    champion = max(hof, key=lambda ind: score_valid(ind)[0])
    out = {
        "generations": args.generations,
        "population": args.population,
        "seed": args.seed,
        "objective": args.objective,
        "loop_seconds": loop_s,
        "setup_seconds": t_loop - t_start,
        "evaluations": sum(g["evaluated"] for g in gens),
        "per_generation": gens,
        "peak_rss_mb": peak_rss_mb(),
        "champion": str(champion),
        "best_train": float(hof[0].fitness.values[0]),
    }
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
