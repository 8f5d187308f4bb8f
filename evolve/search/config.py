"""The configuration of a run: every option, its default and its valid range.

``Config.validate`` is the one check of a run's configuration, for the command
line, the Python API and a run read back alike: every value's type first
(whole numbers are ``int`` and never ``bool``, numbers are finite, flags are
``bool``, names are ``str``), then its range. It raises ``ConfigError`` with
one line naming the parameter (``tournament``), echoing the value and saying
what is expected; the command line names the option instead (``--tournament``,
``evolve.cli.common``). A run's ``config.json`` is read back through
``Config.from_dict``, which type-checks every value and then validates.

The bounds are those of the run's own reader: a whole number has at most
``jsonio.MAX_INT_DIGITS`` digits (the JSON reader refuses longer ones), so no
configuration accepted at the start makes a run that ``--resume``, ``inspect``
or ``export`` would refuse.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from evolve.errors import EvolveError, shorten, show  # noqa: F401 (re-exported)
from evolve.objectives import OBJECTIVES
from evolve.io.jsonio import MAX_INT_DIGITS
from evolve.lang.features import ALL_INPUT_NAMES, INPUT_NAMES, LOOKAHEAD_INPUT_NAMES


class ConfigError(EvolveError):
    """A configuration value of the wrong type or out of range; one line naming the
    parameter (``param``), echoing the value and saying what is expected (``detail``);
    made with ``ConfigError.of(param, detail)`` (``evolve.errors``)."""


# The largest whole number a run may hold: the run's JSON reader (evolve.io.jsonio)
# refuses integers of more than MAX_INT_DIGITS digits in config.json and checkpoints.
MAX_INT = 10 ** MAX_INT_DIGITS - 1
MAX_POPULATION = 1_000_000


def whole(least: int) -> str:
    """What a whole number bounded only by the reader must be."""
    return f"a whole number >= {least} of at most {MAX_INT_DIGITS} digits"


# What each kind of value must be (the dataclass annotations name the kind).
KINDS = {"int": "a whole number", "float": "a finite number", "bool": "True or False",
         "str": "a string"}


def is_kind(kind: str, value) -> bool:
    """Whether ``value`` is of ``kind``: ints are real ints (not bool), floats finite
    real numbers (an int is a float), bools bool and strings str."""
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return ((isinstance(value, int) and not isinstance(value, bool))
                or (isinstance(value, float) and math.isfinite(value)))
    if kind == "str":
        return isinstance(value, str)
    raise AssertionError(kind)


@dataclass
class Config:
    """A run's settings: the keyword arguments of ``evolve.run`` and the options of
    ``evolve run``. The defaults are the values in the signature.

    - Search: ``generations``, ``population``, ``seed`` (the run's whole history
      follows from it), ``tournament`` and ``parsimony`` (the fitness and size
      tournaments of DEAP's double tournament), ``cx_prob`` and ``mut_prob``
      (crossover and mutation probabilities), ``max_height`` and ``max_size``
      (tree limits), ``init_min_height`` and ``init_max_height`` (the first
      population's trees), ``elitism`` (elites kept each generation), ``hof_size``
      (the hall of fame), ``seed_baselines`` (the baselines, as trees, in the
      first population; with ``lookahead`` also the value gate's form on ``ahead``,
      ``evolve.rules.table.gate_tree``).
    - Objective: ``objective`` (a name of ``evolve.objectives.OBJECTIVES``) and its
      limits on traces: ``tv_budget`` (``speed``, ``pareto``: mean TV per token
      allowed), ``kl_budget`` (``speed_kl``: mean KL per token allowed),
      ``tv_position_cap`` and ``tv_p99_cap`` (``speed``, ``speed_kl``: mean slot TV
      at any block position, and the reach-weighted 99th percentile of slot TV;
      1 is no cap); on task traces ``critical_budget`` (``task_speed``: accepted
      critical tokens per answer allowed).
    - Execution: ``threads`` (kernel threads; 0: all cores), ``starts``
      (independent starts with seeds ``seed`` .. ``seed + starts - 1``; the
      champion is the best on valid), ``checkpoint_every`` (generations between
      checkpoints), ``batch_blocks`` (train fitness on that many sampled draft
      blocks a generation; 0: all).
    - Trajectory (``speed`` only; ``evolve.objectives.trajectory_objective``):
      ``trajectory`` scores every individual by the importance-weighted estimate of
      its free-running numbers; ``ess_floor`` is its guard, the least effective
      number of sequences allowed, as a fraction of the split's sequences.
    - Lookahead (trace objectives; ``evolve.lang.features``): ``lookahead`` offers
      the search the lookahead inputs (``next_tv``, ``ahead``: the block's later
      slots, known to verification); a rule that reads them is scored by an estimate.
    - Inputs: ``inputs``, the input names (comma-separated) the search may use, a
      subset of what the data offers (``""``: every input offered), e.g. the inputs an
      engine holds so that the champion exports there (``evolve run --engine vllm``).
    - Device: ``device`` (``cpu``: the Numba kernels; ``cuda``: the torch kernels of
      ``evolve.kernels.gpu``, the same results bit for bit). It is not part of a
      run's identity: a run may be resumed on the other device.

    ``validate`` checks every type and range and raises ``ConfigError`` naming
    the parameter."""
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
    trajectory: bool = False    # speed: score on the rule's own trajectory (importance weights)
    ess_floor: float = 0.1      # trajectory: effective sequences / sequences at least this
    lookahead: bool = False     # traces: offer next_tv and ahead (scored by an estimate)
    inputs: str = ""            # comma-separated input names the search may use ("": all offered)
    critical_budget: float = 0.01   # task_speed: accepted critical tokens per answer allowed
    device: str = "cpu"         # where populations are evaluated (not part of a run's identity)

    @classmethod
    def kinds(cls) -> dict:
        """Each parameter's kind (int, float, bool or str), from the annotations."""
        return {f.name: getattr(f.type, "__name__", f.type) for f in fields(cls)}

    def validate(self) -> None:
        def need(cond, param, what):
            if not cond:
                value = getattr(self, param)
                raise ConfigError.of(param, f"{show(value)} is invalid; {what}")
        for param, kind in self.kinds().items():      # types first: ranges compare them
            need(is_kind(kind, getattr(self, param)), param, f"expected {KINDS[kind]}")
        need(1 <= self.generations <= MAX_INT, "generations", f"expected {whole(1)}")
        need(2 <= self.population <= MAX_POPULATION, "population",
             f"expected a whole number 2..{MAX_POPULATION}")
        need(0 <= self.seed <= MAX_INT, "seed", f"expected {whole(0)}")
        need(self.objective in OBJECTIVES, "objective", f"expected one of {', '.join(OBJECTIVES)}")
        need(0.0 <= self.kl_budget <= 100.0, "kl_budget", "expected a KL per token in [0, 100]")
        need(0.0 <= self.tv_position_cap <= 1.0, "tv_position_cap", "expected a TV in [0, 1]")
        need(0.0 <= self.tv_p99_cap <= 1.0, "tv_p99_cap", "expected a TV in [0, 1]")
        need(0.0 <= self.tv_budget <= 1.0, "tv_budget", "expected a TV per token in [0, 1]")
        need(0.0 <= self.critical_budget <= 100.0, "critical_budget",
             "expected accepted critical tokens per answer, in [0, 100]")
        need(not OBJECTIVES[self.objective].multi or self.population % 4 == 0, "population",
             f"objective {self.objective} (NSGA-II) needs a multiple of 4")
        need(1 <= self.tournament <= self.population, "tournament",
             f"expected 1..population ({self.population})")
        need(1.0 <= self.parsimony <= 2.0, "parsimony", "expected 1.0..2.0")
        for name in ("cx_prob", "mut_prob"):
            need(0.0 <= getattr(self, name) <= 1.0, name, "expected a probability in [0, 1]")
        need(self.cx_prob + self.mut_prob <= 1.0, "mut_prob",
             f"cx_prob + mut_prob must be <= 1 (cx_prob is {self.cx_prob!r})")
        need(2 <= self.max_height <= 30, "max_height", "expected 2..30")
        need(3 <= self.max_size <= 1000, "max_size", "expected 3..1000")
        need(1 <= self.init_min_height <= 30, "init_min_height", "expected 1..30")
        need(self.init_min_height <= self.init_max_height <= self.max_height, "init_max_height",
             f"expected init_min_height..max_height ({self.init_min_height}.."
             f"{self.max_height})")
        need(0 <= self.elitism < self.population, "elitism",
             f"expected 0..population-1 ({self.population - 1})")
        need(1 <= self.hof_size <= 1000, "hof_size", "expected 1..1000")
        need(0 <= self.threads <= MAX_INT, "threads", f"expected {whole(0)} (0 = all cores)")
        need(1 <= self.starts <= 1000, "starts", "expected a whole number 1..1000")
        need(self.seed + self.starts - 1 <= MAX_INT, "seed",
             f"the starts' seeds (seed..seed+starts-1) must have at most "
             f"{MAX_INT_DIGITS} digits")
        need(0 <= self.batch_blocks <= MAX_INT, "batch_blocks",
             f"expected a number of draft blocks, {whole(0)} (0 = the whole train split)")
        need(not self.batch_blocks or (OBJECTIVES[self.objective].traces
                                       and not OBJECTIVES[self.objective].multi),
             "batch_blocks", "minibatches are for the objective speed")
        need(1 <= self.checkpoint_every <= MAX_INT, "checkpoint_every", f"expected {whole(1)}")
        need(0.0 <= self.ess_floor <= 1.0, "ess_floor",
             "expected a fraction of the sequences in [0, 1]")
        need(not self.trajectory or self.objective == "speed", "trajectory",
             f"the trajectory estimate is an objective for speed, not {self.objective}")
        need(not (self.trajectory and self.batch_blocks), "batch_blocks",
             "sampled blocks break the sequences the trajectory weights need; "
             "use 0 with trajectory")
        need(not self.lookahead or OBJECTIVES[self.objective].traces, "lookahead",
             f"the lookahead inputs exist on traces; objective {self.objective} "
             "scores tokens")
        need(self.device in ("cpu", "cuda"), "device", "expected cpu or cuda")
        if self.inputs:
            self._check_inputs()
        need(self.device == "cpu" or not self.trajectory,
             "device", "the trajectory estimate is scored on cpu only")

    def input_list(self) -> tuple | None:
        """The inputs the search may use (``inputs`` split at commas), None for all."""
        return tuple(n.strip() for n in self.inputs.split(",")) if self.inputs else None

    def _check_inputs(self) -> None:
        names = self.input_list()
        bad = next((n for n in names if n not in ALL_INPUT_NAMES), None)
        if bad is not None:
            raise ConfigError.of("inputs", f"{show(bad)} is not an input; expected names "
                                 f"among {', '.join(ALL_INPUT_NAMES)}")
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ConfigError.of("inputs", f"{twice!r} is named twice")
        traces = OBJECTIVES[self.objective].trace_inputs
        other = next((n for n in names if n not in INPUT_NAMES), None)
        if other is not None and not traces:
            raise ConfigError.of("inputs", f"{other!r} exists on traces; objective "
                                 f"{self.objective} scores tokens ({', '.join(INPUT_NAMES)})")
        look = next((n for n in names if n in LOOKAHEAD_INPUT_NAMES), None)
        if look is not None and not self.lookahead:
            raise ConfigError.of("inputs", f"{look!r} is a lookahead input: give lookahead "
                                 "(--lookahead) too")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """A Config from a run's config.json; every value is type-checked first."""
        if not isinstance(d, dict):
            raise ConfigError(f"config: expected an object, got {type(d).__name__}")
        kinds = cls.kinds()
        unknown = sorted(set(d) - set(kinds), key=str)
        if unknown:
            raise ConfigError(f"config: unknown key {shorten(repr(unknown[0]))}")
        for key, value in d.items():
            if not is_kind(kinds[key], value):
                raise ConfigError(f"config: {key!r} is {show(value)}; expected "
                                  f"{KINDS[kinds[key]]}")
        cfg = cls(**d)
        cfg.validate()
        return cfg


