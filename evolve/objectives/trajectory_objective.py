"""The speed objective scored on the rule's own trajectory (``evolve run --trajectory``).

``evolve.objectives.trajectory`` estimates a rule's free-running tokens per call, TV
and KL from standard-rule traces by importance weighting whole sequences. A run
with ``Config.trajectory`` is bound to ``SPEED_TRAJECTORY`` (``evolve.objectives.bind``),
which scores every individual by that estimate instead of the plain offline one:
train fitness, valid (champion selection) and the report's test numbers. The population kernel is
``evolve.kernels.trajectory`` (one pass gives the plain and the trajectory sums,
exact fixed point, so a split and the sum of its shards give the same bits).

Score of an individual (``values``): the trajectory tokens per call where the
trajectory TV per token is within ``tv_budget`` (and the plain slot-TV caps, when
set, hold), penalised as the budget penalises (``fitness.speed_fitness``:
1 - the largest excess) otherwise. The effective-sample-size guard is one more
constraint: the Kish effective number of sequences of the last block index's
weights, as a fraction of the split's sequences, must be at least ``ess_floor``
(its shortfall is an excess like the budget's). An undefined estimate (every
weight of some block index 0, or a weight past ``kernels.trajectory.WEIGHT_LIMIT``)
scores 0, below every rule the guard or the budget penalises.

Sequences: the weights need every block of a sequence in one pass, in order. A
split must hold each sequence's blocks consecutively with block indices 0, 1, ...
(``evolve data trace`` writes them so); a sharded split must also keep every
sequence within one shard (``--rows-per-shard`` a multiple of blocks per prompt x
block size). ``split_blocks`` checks both and raises DataError naming the shard,
field and row otherwise.
"""

from __future__ import annotations

import numpy as np

from evolve.kernels import layout
from evolve.kernels.layout import TAIL_OFF
from evolve.objectives.base import Evaluator
from evolve.objectives.fitness import speed_fitness, tail_cap
from evolve.objectives.settings import Setting
from evolve.objectives import trace_objectives as TO
from evolve.objectives.trace_objectives import TraceObjective

class SplitBlocks:
    """Per block of a split (or of each of its shards): the standard rule's recorded
    acceptances, the block index in its sequence and whether it starts one; with the
    number of block indices and of sequences of the whole split."""

    def __init__(self, parts: list, n_index: int, sequences: int):
        self.parts = parts             # one (n_std, index, first) per shard (one: in memory)
        self.n_index = n_index
        self.sequences = sequences


def _blocks_of(ts, where: str, g: int):
    """(n_std, index, first, sequence ids) of a split's blocks, checked to hold every
    sequence consecutively with block indices 0, 1, ..."""
    from evolve.data.tokens import DataError    # lazy: start-up (the token schema)
    c = ts.columns
    acc = np.asarray(c["baseline_accepts"], dtype=bool).reshape(-1, g)
    n_std = np.where(acc.all(axis=1), g, np.argmin(acc, axis=1)).astype(np.int64)
    seq = np.asarray(c["sequence"], np.int64)[::g]
    idx = np.asarray(c["block_index"], np.int64)[::g]
    first = np.ones(seq.size, dtype=bool)
    first[1:] = seq[1:] != seq[:-1]
    want = np.zeros(seq.size, dtype=np.int64)
    if seq.size:
        starts = np.flatnonzero(first)
        want = np.arange(seq.size) - np.repeat(starts, np.diff(np.append(starts, seq.size)))
    bad = np.flatnonzero(idx != want)
    if bad.size:
        b = int(bad[0])
        raise DataError(f"{where}: field 'block_index' row {b * g} is {int(idx[b])}, expected "
                        f"{int(want[b])}: the trajectory objective needs each sequence's "
                        f"blocks consecutive, in order from 0")
    if np.unique(seq[first]).size != int(first.sum()):
        raise DataError(f"{where}: field 'sequence': a sequence's blocks are not consecutive "
                        f"(the trajectory objective needs them so)")
    return n_std, idx, first, seq


def split_blocks(split) -> SplitBlocks:
    """The block information of a split in memory (``ArraySplit``) or sharded
    (``ClusterSplit``); DataError if a sequence is not consecutive or spans shards."""
    from evolve.data.tokens import DataError    # lazy: start-up (the token schema)
    g = int(split.meta["block_size"])
    inner = getattr(split, "split", split)
    if not hasattr(inner, "shards"):            # a TraceSplit held in this process
        n_std, idx, first, seq = _blocks_of(inner, getattr(inner, "name", "split"), g)
        return SplitBlocks([(n_std, idx, first)], int(idx.max()) + 1 if idx.size else 1,
                           int(first.sum()))
    parts, last, seen, n_index = [], None, 0, 1
    heads = set()
    for i in range(len(inner.shards)):
        ts = inner.shard(i)
        where = f"{inner.name} shard {i}"
        head = ts.columns["sequence"][:1]
        if head.size and last is not None and int(head[0]) == last:
            raise DataError(f"{where}: field 'sequence' row 0: sequence {last} spans two "
                            f"shards; the trajectory objective needs whole sequences per "
                            f"shard (reshard with --rows-per-shard a multiple of blocks "
                            f"per prompt x block size)")
        n_std, idx, first, seq = _blocks_of(ts, where, g)
        ids = set(seq[first].tolist())
        if heads & ids:
            raise DataError(f"{where}: field 'sequence': sequence {min(heads & ids)} spans "
                            f"two shards")
        heads |= ids
        if seq.size:
            last = int(seq[-1])
            n_index = max(n_index, int(idx.max()) + 1)
        seen += int(first.sum())
        parts.append((n_std, idx, first))
    return SplitBlocks(parts, n_index, seen)


def evaluator(split, name: str, with_kl: bool = False, tail_cap: float = TAIL_OFF) -> Evaluator:
    """An evaluator whose rows are the plain kernel sums (``evolve.kernels.layout``)
    followed by the trajectory sums (``kernels.trajectory``), float64; ``split``: a
    split behind the ``splits.Split`` protocol."""
    from evolve.kernels import fixed      # lazy: start-up (Numba)
    sb = split_blocks(split)
    backend = getattr(split, "backend", None)

    def kernel(progs):
        from evolve.kernels.trajectory import population_sums     # lazy: start-up (Numba)
        if backend is None:
            plain, traj = population_sums(progs, split.spec_arrays(), sb.parts[0],
                                          sb.n_index, with_kl, tail_cap)
        else:
            plain, traj = shard_sums(backend, progs, sb, with_kl, tail_cap)
        return np.concatenate([fixed.to_float(plain), fixed.to_float(traj)], axis=1)

    shape = split.shape
    return TrajectoryEvaluator(name, kernel, split.spec_arrays() if backend is None else shape,
                               shape.n * shape.k, sb)


class TrajectoryEvaluator(Evaluator):
    """An evaluator whose rows hold the plain and the trajectory sums; ``trajectory``
    is its split's ``SplitBlocks`` (no minibatches: the weights need whole sequences)."""

    def __init__(self, name, kernel, arrays, rows_per_program: int, blocks: SplitBlocks):
        super().__init__(name, kernel, arrays, rows_per_program)
        self.trajectory = blocks


def shard_sums(backend, progs, sb: SplitBlocks, with_kl: bool, tail_cap: float):
    """The exact sums over every shard of a sharded split, scored where the shards are
    (``evolve.cluster.backends``: ``map_shards``, in this process or on a Dask cluster),
    added as integers."""
    from evolve.kernels import fixed      # lazy: start-up (Numba)
    from evolve.lang import treeio        # lazy: start-up (DEAP)
    payload = treeio.payload(progs)       # the programs as plain arrays
    results = backend.map_shards(shard_task, sb.parts, payload, sb.n_index, with_kl,
                                 getattr(backend, "threads", 0), tail_cap)
    return (fixed.total(r[0] for r in results), fixed.total(r[1] for r in results))


def shard_task(shard, blocks, payload, n_index: int, with_kl: bool, threads: int = 0,
               tail_cap: float = TAIL_OFF):
    """Both sums of every program on one loaded shard (``cluster.worker.Shard``); what
    a worker runs."""
    from evolve.kernels.trajectory import population_sums     # lazy: start-up (Numba)
    from evolve.lang.treeio import Programs   # lazy: start-up (DEAP)
    if threads:
        import numba                          # lazy: start-up
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    return population_sums(Programs(*payload), shard.sa, blocks, n_index, with_kl, tail_cap)


def measures(rows, g: int, sb: SplitBlocks) -> dict:
    """Trajectory tokens per call, TV and KL per token, effective sequences (n,) and
    whether each estimate is undefined, from an evaluator's rows."""
    from evolve.kernels import trajectory as K     # lazy: start-up (Numba)
    rows = np.asarray(rows, dtype=np.float64)
    t = rows[:, layout.width(g):]
    B = sb.n_index
    o_w, o_wt, o_w2 = K.offsets(B)
    W, WT, W2 = t[:, o_w:o_w + B], t[:, o_wt:o_wt + B], t[:, o_w2:o_w2 + B]
    with np.errstate(divide="ignore", invalid="ignore"):
        tokens = (WT / W).mean(axis=1)
        tv = t[:, K.TV] / t[:, K.TOKENS]
        kl = t[:, K.KL] / t[:, K.TOKENS]
        ess = W[:, -1] ** 2 / W2[:, -1]
    undefined = ((t[:, K.OVERFLOW] > 0) | ~(W > 0).all(axis=1) | ~np.isfinite(tokens)
                 | ~np.isfinite(tv) | ~np.isfinite(ess))
    return {"tokens": tokens, "tv": tv, "kl": kl, "ess": ess, "undefined": undefined}


def fitness(tokens, dist, budget: float, ess, sequences: int, floor: float, undefined,
            tv_pos=None, cap: float = 1.0, tail_excess=None) -> np.ndarray:
    """``speed_fitness`` of the trajectory numbers with the ESS guard as one more
    excess (floor - ess / sequences); an undefined estimate scores 0."""
    undefined = np.asarray(undefined, dtype=bool)
    excess = floor - np.asarray(ess, dtype=np.float64) / max(sequences, 1)
    if tail_excess is not None:
        excess = np.maximum(excess, tail_excess)
    tokens = np.where(undefined, 0.0, tokens)
    dist = np.where(undefined, 0.0, dist)
    excess = np.where(undefined, 1.0, excess)
    return np.asarray(speed_fitness(tokens, dist, budget, tv_pos, cap, excess),
                      dtype=np.float64)


def values(objective, ev: Evaluator, trees, config, deap_trees=None) -> np.ndarray:
    """Fitness values (n, 1) of trees by the trajectory estimate (see the module doc)."""
    m = measures(ev.rows(trees, deap_trees), ev.arrays.g, ev.trajectory)
    tv_pos = tail = None
    if config.tv_position_cap < 1.0 or config.tv_p99_cap < 1.0:     # the plain caps
        plain = objective.measures(ev, trees, deap_trees)
        tv_pos = plain["tv_pos"]
        if config.tv_p99_cap < 1.0:
            from evolve.objectives.spec import TAIL_SHARE  # lazy: start-up (trace schema)
            tail = plain["tail_share"] - TAIL_SHARE
    tail = TO.worst(tail, TO.first_excess(ev, trees, config, deap_trees))
    measure, budget = objective.budget_of(config)
    dist = m[measure]
    return fitness(m["tokens"], dist, budget, m["ess"], ev.trajectory.sequences,
                   config.ess_floor, m["undefined"], tv_pos, config.tv_position_cap,
                   tail)[:, None]


def split_metrics(sa, split, h) -> dict:
    """The trajectory estimate of the thresholds ``h`` on one split (TraceArrays ``sa``),
    by the numpy reference (``trajectory.estimate``), JSON-safe (non-finite: None)."""
    from evolve.objectives import trajectory    # lazy: start-up (the trace schema)
    inner = getattr(split, "split", split)
    ts = inner.concat() if hasattr(inner, "shards") else inner
    est = trajectory.estimate(sa, trajectory.TraceBlocks.from_split(ts), h)
    return {k: (float(v) if np.isfinite(v) else None) if isinstance(v, float) else v
            for k, v in est.to_dict().items()}


def split_score(m: dict, config) -> float:
    """The score of a champion from its metrics on one split (``m["trajectory"]``, with
    the plain caps from ``m``), as ``values`` scores it."""
    t = m.get("trajectory") or {}
    vals = [t.get(k) for k in ("tokens_per_call", "tv_per_token", "effective_sequences")]
    undefined = any(v is None for v in vals) or not t.get("sequences")
    tok, tv, ess = (0.0 if v is None else v for v in vals)
    p99 = config.tv_p99_cap
    tail = m["tv_p99"] - p99 if p99 < 1.0 and m.get("tv_p99") is not None else None
    tail = TO.worst(tail, TO.first_split_excess(m, config))
    return float(fitness(tok, tv, config.tv_budget, ess, t.get("sequences") or 1,
                         config.ess_floor, undefined,
                         np.asarray(m.get("tv_by_position") or [0.0]),
                         config.tv_position_cap, tail))


ESS_FLOOR = Setting("ess_floor", 0.1, 0.0, 1.0, "--ess-floor",
                    "with --trajectory, the least effective number of sequences, as a "
                    "fraction of the split's sequences, below which a rule is infeasible",
                    "a fraction of the sequences in [0, 1]")


class TrajectoryObjective(TraceObjective):
    """``speed`` scored by the trajectory estimate (see the module doc): its evaluator,
    values, the ``trajectory`` metrics of a champion and the score of a split."""

    def __init__(self, name: str, weights: tuple, help: str, kl: bool = False):
        super().__init__(name, weights, help, kl)
        self.settings = (*self.settings, ESS_FLOOR)

    def evaluator(self, split, name: str, config=None) -> Evaluator:
        from evolve.objectives.splits import as_split    # lazy: start-up (the trace schema)
        ev = evaluator(as_split(split), name, self.kl, tail_cap(config))
        if config is not None and config.tv_first_cap < 1.0:
            TO.first_parts(ev, config.first_tokens)     # refused here, before any search
        return ev

    def values(self, ev: Evaluator, trees, config, deap_trees=None) -> np.ndarray:
        return values(self, ev, trees, config, deap_trees)

    def extra_metrics(self, sa, split, h) -> dict:
        return {"trajectory": split_metrics(sa, split, h)}

    def split_score(self, m: dict, config) -> float:
        return split_score(m, config)


SPEED_TRAJECTORY = TrajectoryObjective(
    "speed", (1.0,), "tokens per target call within --budget-tv on the rule's own "
    "trajectory (importance-weighted estimate; --trajectory)")
