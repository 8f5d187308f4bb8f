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
from dataclasses import asdict, dataclass, field, fields

from evolve.errors import EvolveError, shorten, show  # noqa: F401 (re-exported)
from evolve.objectives import ALL_OBJECTIVES, OBJECTIVES, SETTINGS
from evolve.objectives.placement import DEVICES
from evolve.objectives.settings import option_help
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


def option(default, help: str):
    """A field of ``Config`` with its ``help``: what ``help(evolve.run)`` and ``evolve run
    --help`` say of it (``Config.help_of``)."""
    return field(default=default, metadata={"help": help})


def _with_objective_settings(cls):
    """``Config`` as a dataclass: the fields written in its body, and after ``objective``
    every objective's settings (``evolve.objectives.SETTINGS``: name, kind, default and
    help as the objectives declare them)."""
    annotations = {}
    for name, kind in cls.__annotations__.items():
        annotations[name] = kind
        if name == "objective":
            for s in SETTINGS:
                annotations[s.name] = s.kind
                setattr(cls, s.name, field(default=s.default, metadata={"help": s.help,
                                                                           "setting": s}))
    cls.__annotations__ = annotations
    return dataclass(cls)


@_with_objective_settings
class Config:
    """A run's settings: the keyword arguments of ``evolve.run`` and the options of
    ``evolve run``; each field is declared once, with its default and help, below or
    (the objectives' settings: budgets, caps, floors) by the objective that reads it
    (``evolve.objectives.settings``).

    - Search: the size of the run and DEAP's double tournament, variation, tree
      limits, elitism, hall of fame, and ``seed``: the run's whole history follows
      from it.
    - Objective: ``objective`` (a name of ``evolve.objectives.OBJECTIVES``) and the
      settings of every objective (``evolve.objectives.SETTINGS``), each read by the
      objectives that declare it; ``trajectory`` binds ``speed`` scored on each rule's
      own trajectory (``evolve.objectives.trajectory_objective``).
    - Execution: ``threads``, ``starts`` (independent starts with seeds ``seed`` ..
      ``seed + starts - 1``; the champion is the best on valid), ``checkpoint_every``,
      ``batch_blocks``, ``device`` (``cpu``: the Numba kernels; ``cuda``: the kernels of
      ``evolve.kernels.gpu``, the same results bit for bit; not part of a run's
      identity: a run may be resumed on the other device).
    - Inputs: ``lookahead`` (``evolve.lang.features``) and ``inputs``, the input names
      the search may use (e.g. the inputs an engine holds, ``evolve run --engine``).

    ``help_of(name)`` is a field's help; ``validate`` checks every type and range and
    raises ``ConfigError`` naming the parameter."""
    generations: int = option(100, "Generations")
    population: int = option(1000, "Population size")
    seed: int = option(0, "Random seed (the run's whole history follows from it)")
    objective: str = option("expected", "What the run maximises: one of "
                                        f"{', '.join(OBJECTIVES)} (evolve.objectives)")
    tournament: int = option(7, "Tournament size (the fitness tournament of DEAP's "
                                "double tournament)")
    parsimony: float = option(1.4, "Size tournament of DEAP's double tournament (1..2)")
    cx_prob: float = option(0.7, "Crossover probability")
    mut_prob: float = option(0.25, "Mutation probability")
    max_height: int = option(10, "Tree height limit")
    max_size: int = option(60, "Tree size limit (nodes)")
    init_min_height: int = option(1, "Least height of the first population's trees")
    init_max_height: int = option(4, "Height limit of the first population's trees")
    elitism: int = option(2, "Elites kept each generation")
    hof_size: int = option(20, "Trees in the hall of fame")
    seed_baselines: bool = option(False, "Put the baselines (as trees) into the first "
                                         "population; with lookahead, the value gate on "
                                         "ahead too")
    threads: int = option(0, "Kernel threads (0 = all cores)")
    starts: int = option(1, "Independent starts (seeds seed..seed+N-1); the champion is "
                            "the best on valid")
    checkpoint_every: int = option(1, "Generations between checkpoints")
    batch_blocks: int = option(0, "Train fitness on N sampled draft blocks a generation "
                                  "(speed; 0 = all)")
    trajectory: bool = option(False, "Objective speed: score every rule on its own "
                                     "trajectory (importance-weighted free-running "
                                     "estimate) on train, valid and test")
    lookahead: bool = option(False, "Trace objectives: also offer next_tv and ahead, what "
                                    "verification knows of the block's later drafted "
                                    "slots (such rules are scored by an estimate; compare "
                                    "them free-running with evolve simulate --compare)")
    inputs: str = option("", "Only these inputs (comma-separated) in the search, a subset "
                             "of what the data offer (all of them by default); a name "
                             "ending in ? is used where the data offer it")
    device: str = option("cpu", "Evaluate populations on cpu (the Numba kernels) or cuda "
                                "(the same results bit for bit; pip install '.[gpu]')")

    @classmethod
    def help_of(cls, name: str, default: bool = True) -> str:
        """The help of field ``name``, with its default as ``--help`` shows it
        (``default``), as declared (an objective's setting: by the objective)."""
        f = next(f for f in fields(cls) if f.name == name)
        setting = f.metadata.get("setting")
        if setting is not None:
            return option_help(setting, ALL_OBJECTIVES, default)
        if not default or isinstance(f.default, bool) or f.default == "":
            return f"{f.metadata['help']}."
        return f"{f.metadata['help']} [{f.default}]."

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
        for setting in SETTINGS:        # as the objectives declare them
            need(setting.in_range(getattr(self, setting.name)), setting.name,
                 f"expected {setting.expect}")
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
        need(self.device in DEVICES, "device", f"expected {' or '.join(DEVICES)}")
        if self.inputs:
            self._check_inputs()
        need(self.device == "cpu" or not self.trajectory,
             "device", "the trajectory estimate is scored on cpu only")

    def input_list(self) -> tuple | None:
        """The inputs the search may use (``inputs`` split at commas, each name without
        its ``?``), None for all."""
        return (tuple(n.strip().rstrip("?") for n in self.inputs.split(","))
                if self.inputs else None)

    def optional_inputs(self) -> set:
        """The inputs named with a trailing ``?``: used where the data offer them (what
        ``evolve run --engine`` names for the inputs only some data hold)."""
        return {n.strip()[:-1] for n in self.inputs.split(",") if n.strip().endswith("?")}

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
    def from_dict(cls, d: dict, validate: bool = True) -> "Config":
        """A Config from a run's config.json; every value is type-checked first, then
        (``validate``) every range: a resumed run validates once, after what it may
        change is set (``evolve.runs.lifecycle``)."""
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
        if validate:
            cfg.validate()
        return cfg


