"""The sizes of the speed benchmark (``benchmarks/speed/harness.py``), full and
``--smoke``, and its random population: what the harness and the scripts that time
the same trees (``trace_speed.py``, ``gpu_eval.py``, ``cluster.py``) share.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolve.lang import randtrees


@dataclass(frozen=True)
class Sizes:
    pop_size: int = 1000          # random population of section 1
    pop_min_height: int = 2
    pop_max_height: int = 6
    pop_seed: int = 20240611
    rows: int | None = None       # None: whole splits; else the first rows of each
    repeats: int = 5              # timing rounds of section 1 (each: both paths)
    run_generations: int = 100
    run_population: int = 1000
    run_seed: int = 1
    champion_repeats: int = 25
    help_repeats: int = 7
    benchmark_repeats: int = 3
    cold_population: int = 100    # the small `evolve run` of the cold-start section
    njit_trees: int = 20
    njit_seed: int = 7


FULL = Sizes()
SMOKE = Sizes(pop_size=24, pop_max_height=4, rows=1500, repeats=1, run_generations=2,
              run_population=24, champion_repeats=3, help_repeats=1, benchmark_repeats=1,
              cold_population=24, njit_trees=2)


def random_trees(pset, n: int, min_h: int, max_h: int, seed: int, distinct: bool = False):
    """DEAP trees from genHalfAndHalf under a fixed seed (``evolve.lang.randtrees``)."""
    return randtrees.deap_trees(pset, n, seed, min_h, max_h, distinct)
