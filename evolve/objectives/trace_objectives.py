"""Objectives on speculative-decoding traces: speed within a TV budget, and NSGA-II.

Both are exact (``evolve.objectives.spec``): expected tokens per target call
and the TV per emitted token of the output distribution, from the draft's
top-k candidates of schema-v2 traces, computed for whole populations by
``evolve.kernels.speculative``.

``speed``     tokens per call where the mean TV per token is within
              ``--budget-tv``; rules over budget score below 1 (below every
              feasible rule), less the further they are over.
``speed_kl``  the same with the mean KL per token within ``--budget-kl``.
``pareto``    NSGA-II over (tokens per call, TV per token); the champion is
              chosen on valid by the ``speed`` score at the run's budget.

``--cap-tv-position C`` adds a constraint to ``speed`` and ``speed_kl``: the mean
slot TV at every block position (given it is reached) must be at most C, so a
rule cannot buy its tokens by spending all its distortion at one block position.
``--cap-tv-p99 C`` caps the tail instead: the reach-weighted 99th percentile of
slot TV (``tv_p99`` of the reports) must be at most C, that is at most 1% of the
reach may fall on slots with TV above C (the kernel sums that reach exactly).
``--cap-tv-first C`` caps where an instruction model's answer starts: the mean slot TV
(reach-weighted, as ``tv_by_distance`` of the reports) over the first ``--first-tokens
K`` tokens after the prompt (default 1: the answer's first token) must be at most C,
so a rule cannot keep its average by spending its distortion on the answer's first
words. It is exact on the recorded path: the kernel sums the blocks that start at each
distance s < K over their first K - s positions (``first_tv``).

``--trajectory`` (``Config.trajectory``, ``speed`` only) binds the run to another
objective (``evolve.objectives.bind``): ``speed`` scored by the importance-weighted
estimate of every rule's free-running numbers
(``evolve.objectives.trajectory_objective``, kernel ``evolve.kernels.trajectory``),
with an effective-sample-size guard (``--ess-floor``).

A champion's report (``evolve.tasks.traces.TraceTask.report``) adds every rule
family of ``evolve.rules`` tuned to the same budget on valid (reported on test)
and the trade-off on valid.
"""

from __future__ import annotations

import numpy as np

from evolve.errors import EvolveError
from evolve.kernels import layout
from evolve.lang.features import REGISTRY
from evolve.objectives.base import TRACES, Evaluator, Objective
from evolve.objectives.settings import Setting
from evolve.objectives.fitness import speed_fitness, tail_cap
from evolve.objectives import placement


# The settings of the trace objectives. Every trace run records the TV budget: a trace
# champion is written back by its speed score at that budget (evolve.tasks.writeback),
# whichever objective made it.
TV_BUDGET = Setting("tv_budget", 0.02, 0.0, 1.0, "--budget-tv", "mean TV per token allowed",
                    "a TV per token in [0, 1]", meta="tv_budget")
KL_BUDGET = Setting("kl_budget", 0.01, 0.0, 100.0, "--budget-kl", "mean KL per token allowed",
                    "a KL per token in [0, 100]", meta="kl_budget")
TV_POSITION_CAP = Setting("tv_position_cap", 1.0, 0.0, 1.0, "--cap-tv-position",
                          "mean slot TV allowed at any block position", "a TV in [0, 1]",
                          meta="tv_position_cap", off=1.0, off_text="no cap")
TV_P99_CAP = Setting("tv_p99_cap", 1.0, 0.0, 1.0, "--cap-tv-p99",
                     "99th percentile of slot TV allowed (reach-weighted)", "a TV in [0, 1]",
                     meta="tv_p99_cap", off=1.0, off_text="no cap")

TV_FIRST_CAP = Setting("tv_first_cap", 1.0, 0.0, 1.0, "--cap-tv-first",
                       "mean slot TV allowed over the first tokens after the prompt "
                       "(--first-tokens of them)", "a TV in [0, 1]",
                       meta="tv_first_cap", off=1.0, off_text="no cap")
MAX_FIRST = 16
FIRST_TOKENS = Setting("first_tokens", 1, 1, MAX_FIRST, "--first-tokens",
                       "the tokens after the prompt that --cap-tv-first caps",
                       f"a whole number in [1, {MAX_FIRST}]", meta="first_tokens", off=1,
                       off_text="the answer's first token")
POSITION = [i.name for i in REGISTRY].index("position")    # its row of an input matrix


def first_parts(ev: Evaluator, k: int) -> list:
    """(width, evaluator) of the blocks of ``ev`` that start s < ``k`` tokens after the
    prompt, one per distance s (width: their first min(k - s, g) positions, those
    within the first ``k`` tokens), scored by the Numba kernel in this process (they are
    few); made once per evaluator. A one-line ``EvolveError`` naming ``tv_first_cap``
    where the split's rows are not in this process."""
    cache = ev.__dict__.setdefault("_first_parts", {})
    if k not in cache:
        from evolve.objectives.splits import array_evaluator  # lazy: start-up (trace schema)
        sa = ev.arrays
        if getattr(sa, "X", None) is None:
            raise EvolveError.of("tv_first_cap", f"{ev.name}: the first tokens' cap needs "
                                 "the split's rows in this process, not a sharded split")
        start = np.asarray(sa.X[POSITION]).reshape(sa.n, sa.k)[::sa.g, 0]
        cache[k] = [(min(k - s, sa.g), array_evaluator(sa.blocks(np.flatnonzero(start == s)),
                                                       f"{ev.name} first {k}"))
                    for s in range(k) if (start == s).any()]
    return cache[k]


def first_tv(ev: Evaluator, trees, k: int, deap_trees=None) -> np.ndarray:
    """The mean slot TV (reach-weighted) over the first ``k`` tokens after the prompt of
    each tree on the recorded path, (n,), exact (0 where no such slot is reached)."""
    L = layout.sums_layout(ev.arrays.g)
    num = den = np.zeros(len(trees))
    for width, sub in first_parts(ev, k):
        rows = sub.rows(trees, deap_trees)
        num = num + rows[:, L.tv_pos][:, :width].sum(axis=1)
        den = den + rows[:, L.reach][:, :width].sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, 0.0)


def first_excess(ev: Evaluator, trees, config, deap_trees=None):
    """How far each tree's first-token TV is over ``--cap-tv-first`` (None: no cap)."""
    if config.tv_first_cap >= 1.0:
        return None
    return first_tv(ev, trees, config.first_tokens, deap_trees) - config.tv_first_cap


def worst(*excess):
    """The largest of the excesses given (None: that cap is off), or None."""
    given = [np.asarray(e, dtype=np.float64) for e in excess if e is not None]
    return None if not given else np.maximum.reduce(given) if len(given) > 1 else given[0]


class TraceObjective(Objective):
    data = TRACES

    def __init__(self, name: str, weights: tuple, help: str, kl: bool = False):
        self.name = name
        self.weights = weights
        self.help = help
        self.kl = kl          # the budget is on KL per token (--budget-kl), not TV
        self.measure = "kl" if kl else "tv"      # what its budget bounds, per token
        self.budget = KL_BUDGET if kl else TV_BUDGET
        caps = () if self.multi else (TV_POSITION_CAP, TV_P99_CAP, TV_FIRST_CAP,
                                      FIRST_TOKENS)
        self.settings = tuple(dict.fromkeys((self.budget, TV_BUDGET, *caps)))

    def budget_of(self, config) -> tuple[str, float]:
        """(the measure its budget bounds, ``tv`` or ``kl``; the budget) in ``config``."""
        return self.measure, getattr(config, self.budget.name)

    def front(self, population, sas: dict) -> list | None:
        """The final population's non-dominated front on every split (``evolved_front``)
        for an objective of several values (NSGA-II), else None."""
        return evolved_front(population, sas) if self.multi else None

    def evaluator(self, split, name: str, config=None) -> Evaluator:
        cap = tail_cap(None if self.multi else config)
        ev = placement.trace_evaluator(split, name, config, cap, self.kl)
        if not self.multi and config is not None and config.tv_first_cap < 1.0:
            first_parts(ev, config.first_tokens)      # refused here, before any search
        return ev

    @staticmethod
    def tokens_tv(ev: Evaluator, trees, deap_trees=None):
        sums = ev.rows(trees, deap_trees)
        L = layout.sums_layout(ev.arrays.g)
        return sums[:, L.tokens] / ev.arrays.n_blocks, sums[:, L.tv] / sums[:, L.tokens]

    @staticmethod
    def measures(ev: Evaluator, trees, deap_trees=None) -> dict:
        """tokens, tv, kl per token and slot TV per block position, (n,) / (n, g), and
        the share of the reach on slots over the evaluator's tail cap (0 without one)."""
        sums = ev.rows(trees, deap_trees)
        L = layout.sums_layout(ev.arrays.g)
        tok = sums[:, L.tokens]
        den = sums[:, L.reach]
        with np.errstate(invalid="ignore", divide="ignore"):
            tv_pos = np.where(den > 0, sums[:, L.tv_pos] / den, 0.0)
        return {"tokens": tok / ev.arrays.n_blocks, "tv": sums[:, L.tv] / tok,
                "kl": sums[:, L.kl] / tok, "tv_pos": tv_pos,
                "tail_share": sums[:, L.tail] / den.sum(axis=1)}

    def values(self, ev: Evaluator, trees, config, deap_trees=None) -> np.ndarray:
        m = self.measures(ev, trees, deap_trees)
        if self.multi:
            return np.column_stack([m["tokens"], m["tv"]])
        from evolve.objectives.spec import TAIL_SHARE    # lazy: start-up (the trace schema)
        measure, budget = self.budget_of(config)
        dist = m[measure]
        tail = m["tail_share"] - TAIL_SHARE if config.tv_p99_cap < 1.0 else None
        tail = worst(tail, first_excess(ev, trees, config, deap_trees))
        return np.atleast_1d(speed_fitness(m["tokens"], dist, budget, m["tv_pos"],
                                           config.tv_position_cap, tail))[:, None]

    def scores(self, values, config) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        if self.multi:
            return np.asarray(speed_fitness(v[:, 0], v[:, 1], config.tv_budget),
                              dtype=np.float64)
        return v[:, 0]

    def metrics(self, nodes, splits: dict, evaluators: dict) -> dict:
        """Exact objectives per split (kernel; on a sharded split, summed where the
        shards are), with the 99th percentile of slot TV from the reference on the
        kernel's thresholds (which needs the split's rows in this process)."""
        from evolve.kernels.tokens import matrix_thresholds  # lazy: start-up (Numba)
        from evolve.objectives import spec    # lazy: start-up (the trace schema)
        from evolve.objectives.splits import as_split, spec_arrays  # lazy: as above
        from evolve.lang import treeio    # lazy: start-up (the primitive table loads Numba)
        progs = treeio.linearise([nodes])
        out = {}
        for k, split in splits.items():
            sa = spec_arrays(k, splits, evaluators)
            split = as_split(split, sa)      # sharded: summed where the shards are
            m = spec.objectives_from_sums(split.sums(progs, with_kl=True)[0],
                                     split.shape.n_blocks, split.shape.g).to_dict()
            h = matrix_thresholds(progs, sa.X)[0]
            m["tv_p99"] = spec.objectives(sa, h).tv_p99
            m["tv_first"] = spec.tv_first(sa, h, MAX_FIRST)
            m.update(self.extra_metrics(sa, split, h))
            out[k] = m
        return out

    def extra_metrics(self, sa, split, h) -> dict:
        """More metrics of a champion's thresholds ``h`` on one split (none here)."""
        return {}

    def split_score(self, m: dict, config) -> float:
        measure, budget = self.budget_of(config)
        dist = m[f"{measure}_per_token"]
        cap = 1.0 if self.multi else config.tv_position_cap
        p99 = 1.0 if self.multi else config.tv_p99_cap
        tail = m["tv_p99"] - p99 if p99 < 1.0 and m.get("tv_p99") is not None else None
        if not self.multi:
            tail = worst(tail, first_split_excess(m, config))
        return float(speed_fitness(m["tokens_per_call"], dist, budget,
                                   np.asarray(m.get("tv_by_position") or [0.0]), cap, tail))


def first_split_excess(m: dict, config):
    """How far a champion's metrics ``m`` of a split are over ``--cap-tv-first``."""
    if config.tv_first_cap >= 1.0 or not m.get("tv_first"):
        return None
    return m["tv_first"][config.first_tokens - 1] - config.tv_first_cap


def evolved_front(population, sas: dict) -> list[dict]:
    """The final population's non-dominated trees on train (tokens per call up,
    TV down), each scored exactly on train, valid and test."""
    from deap import tools    # lazy: start-up (DEAP loads only where it is used)
    from evolve.lang import codegen, treeio    # lazy: start-up (the primitive table loads Numba)
    from evolve.objectives.spec import population_results    # lazy: start-up (trace schema)

    first = tools.sortNondominated(population, len(population),
                                   first_front_only=True)[0]
    trees = sorted({str(ind) for ind in first})
    progs = treeio.linearise([treeio.parse(t) for t in trees])
    scores = {k: population_results(progs, sa, with_kl=False) for k, sa in sas.items()}
    out = []
    for i, t in enumerate(trees):
        out.append({"tree": t, "expression": codegen.infix(treeio.parse(t)),
                    **{k: {"tokens_per_call": v[i].tokens_per_call,
                           "tv_per_token": v[i].tv_per_token} for k, v in scores.items()}})
    return sorted(out, key=lambda f: (f["train"]["tv_per_token"], f["tree"]))


SPEED = TraceObjective("speed", (1.0,), f"tokens per target call within {TV_BUDGET.flag} "
                       "(traces)")
SPEED_KL = TraceObjective("speed_kl", (1.0,), f"tokens per target call within {KL_BUDGET.flag} "
                          "(mean KL per token; traces)", kl=True)
PARETO = TraceObjective("pareto", (1.0, -1.0), "NSGA-II over tokens per call and TV (traces)")
