"""The configuration of a run: every option, its default and its valid range.

``Config.validate`` checks every value and raises ``ConfigError`` with one line
naming the option, echoing the value and saying what is expected; a run's
``config.json`` is read back through ``Config.from_dict``, which type-checks
every value first.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from evolve.objectives import OBJECTIVES


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
    kl_budget: float = 0.01     # objective "speed_kl": mean KL per token allowed
    tv_position_cap: float = 1.0    # speed, speed_kl: mean slot TV at any block position
    tv_p99_cap: float = 1.0     # speed, speed_kl: reach-weighted 99th percentile of slot TV
    threads: int = 0            # 0: Numba's default (all cores)
    starts: int = 1             # independent runs (seeds seed..seed+starts-1), best on valid
    checkpoint_every: int = 1
    batch_blocks: int = 0       # train fitness on N sampled draft blocks a generation (0: all)

    def validate(self) -> None:
        def need(cond, option, value, what):
            if not cond:
                raise ConfigError(f"--{option.replace('_', '-')}: {value!r} is invalid; {what}")
        need(isinstance(self.generations, int) and self.generations >= 1, "generations",
             self.generations, "expected a whole number >= 1")
        need(isinstance(self.population, int) and 2 <= self.population <= MAX_POPULATION,
             "population", self.population, f"expected a whole number 2..{MAX_POPULATION}")
        need(self.objective in OBJECTIVES, "objective", self.objective,
             f"expected one of {', '.join(OBJECTIVES)}")
        need(isinstance(self.kl_budget, (int, float)) and 0.0 <= self.kl_budget <= 100.0,
             "budget_kl", self.kl_budget, "expected a KL per token in [0, 100]")
        need(isinstance(self.tv_position_cap, (int, float))
             and 0.0 <= self.tv_position_cap <= 1.0, "cap_tv_position", self.tv_position_cap,
             "expected a TV in [0, 1]")
        need(isinstance(self.tv_p99_cap, (int, float)) and 0.0 <= self.tv_p99_cap <= 1.0,
             "cap_tv_p99", self.tv_p99_cap, "expected a TV in [0, 1]")
        need(0.0 <= self.tv_budget <= 1.0, "budget_tv", self.tv_budget,
             "expected a TV per token in [0, 1]")
        need(not (self.objective in OBJECTIVES and OBJECTIVES[self.objective].multi)
             or self.population % 4 == 0, "population", self.population,
             f"objective {self.objective} (NSGA-II) needs a multiple of 4")
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
        need(isinstance(self.starts, int) and 1 <= self.starts <= 1000, "starts", self.starts,
             "expected a whole number 1..1000")
        need(self.batch_blocks >= 0, "batch_blocks", self.batch_blocks,
             "expected a number of draft blocks >= 0 (0 = the whole train split)")
        need(not self.batch_blocks or (self.objective in OBJECTIVES
                                       and OBJECTIVES[self.objective].traces
                                       and not OBJECTIVES[self.objective].multi),
             "batch_blocks", self.batch_blocks, "minibatches are for the objective speed")
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
            raise ConfigError(f"config: unknown key {shorten(repr(unknown[0]))}")
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
                raise ConfigError(f"config: {key!r} is {shorten(repr(value))}; expected "
                                  f"{'a finite number' if want is float else want.__name__}")
        cfg = cls(**d)
        cfg.validate()
        return cfg


MAX_POPULATION = 1_000_000


def shorten(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


