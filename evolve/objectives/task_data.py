"""Task splits as the task objectives read them: ``TaskData`` (in this process: the input
matrix of the drafted rows and the labels' decisions), ``ShardedTaskData`` (shards
scored where they are), ``task_data`` (which of the two) and ``metrics_of`` (a split's
metrics from a program's sums row). The objectives themselves are
``evolve.objectives.task_objectives``.
"""

from __future__ import annotations

import numpy as np

from evolve.data import inputs
from evolve.data import labels as LB
from evolve.kernels import fixed
from evolve.lang import treeio
from evolve.objectives import task_labels as TL

CHUNK_VALUES = 1 << 22        # thresholds (programs x rows) held at once: 32 MiB


def drafted_matrix(cols: dict, meta: dict) -> np.ndarray:
    """The float64 input matrix of the drafted rows (each row's own token), in the
    registry's order (``evolve.data.inputs.input_matrix``): the inputs of traces with
    slot features and the answer and verify groups (the lookahead ones are not offered
    here: their rows are NaN)."""
    return inputs.input_matrix(inputs.readable(cols, meta), "drafted", GROUPS)


GROUPS = ("token", "trace", "slot", "answer", "verify", "rank", "vocab")  # the task world offers


class TaskData:
    """A task split as the objectives read it: the input matrix ``X`` of its drafted
    rows and the ``task_labels.TaskArrays`` of its decisions and labels."""

    def __init__(self, task_split):
        self._build(task_split.traces.columns, task_split.meta, task_split.critical)

    @classmethod
    def of_columns(cls, columns: dict, meta: dict) -> "TaskData":
        """A task split from trace columns that hold the labels too (``critical``: a
        sharded task split, whole or one shard)."""
        td = cls.__new__(cls)
        td._build(columns, meta, columns[LB.COLUMN])
        return td

    def _build(self, c: dict, meta: dict, critical) -> None:
        greedy = meta["decoding"] == "greedy"
        g = int(meta["block_size"])
        self.X = drafted_matrix(c, meta)
        if greedy:
            s = (c["token"] == c["target_top"]).astype(np.float64)
            inside, outside = s < 1.0, np.ones_like(s)
        else:
            s = np.minimum(1.0, c["target_prob"] / c["draft_prob"])
            inside, outside = np.asarray(c["draft_cand"]) >= 0, s
        answers = int(np.unique(np.asarray(c["sequence"])).size)
        self.arrays = TL.TaskArrays(g, s, inside, outside, np.array(critical, dtype=np.int8),
                                    answers)
        self.n = s.size
        self.g = g
        self.greedy = greedy
        self.distance = np.asarray(c["position"])    # from the prompt (0: its first token)
        self.missing = ""         # task traces are schema v3: the slot features are there
        self._derived = None      # plog, pexp, psqrt of X: made on first use, kept

    @property
    def n_blocks(self) -> int:
        return self.arrays.n_blocks

    def sums(self, progs, chunk_blocks: int | None = None) -> np.ndarray:
        """Every program's ``task_labels.SUMS`` row on this split (``chunk_blocks``: see
        ``fixed_sums``; any value gives the same bits)."""
        return TL.from_fixed(self.fixed_sums(progs, chunk_blocks), self.n_blocks,
                             self.arrays.answers)

    def fixed_sums(self, progs, chunk_blocks: int | None = None) -> np.ndarray:
        """Every program's block sums in fixed point (``task_labels.fixed_sums``),
        computed ``chunk_blocks`` blocks at a time (default: about ``CHUNK_VALUES``
        thresholds held at once, whatever the population and the split): the same
        integers for any chunking."""
        from evolve.kernels.tokens import derived_columns, matrix_thresholds  # lazy: start-up (Numba)
        if self._derived is None:
            self._derived = derived_columns(self.X)
        g, nb = self.g, self.n_blocks
        per = chunk_blocks or max(1, CHUNK_VALUES // max(1, len(progs)) // g)
        out = np.zeros((len(progs), len(TL.BLOCK_SUMS), 2), dtype=np.int64)
        for lo in range(0, nb, per):
            hi = min(lo + per, nb)
            r = slice(lo * g, hi * g)
            h = matrix_thresholds(progs, np.ascontiguousarray(self.X[:, r]),
                                  np.ascontiguousarray(self._derived[:, r]))
            out = fixed.add(out, TL.fixed_sums(h, self.arrays.blocks(lo, hi)))
        return out

    def thresholds_sums(self, h) -> np.ndarray:
        """The sums of thresholds already computed (a rule that is not a tree)."""
        return TL.sums(h, self.arrays)

    def critical_by_distance(self, h) -> dict:
        """``task_labels.critical_by_distance`` of one program's thresholds here."""
        return TL.critical_by_distance(h, self.arrays, self.distance)

    def whole(self) -> "TaskData":
        """The whole split in this process: this one (``ShardedTaskData.whole`` loads it)."""
        return self


class ShardedTaskData:
    """A sharded task split (``evolve data shard`` of task traces), scored where its
    shards are: each shard's fixed-point block sums (``shard_sums``, in this process or
    on the Dask worker that holds the shard, through the split's backend
    ``map_shards``) added exactly, so the sums are the in-memory split's bit for bit.
    The split's answers (distinct problems) are counted once, from the shards'
    ``sequence`` columns."""

    missing = ""                  # task traces are schema v3: the slot features are there

    def __init__(self, split):
        from evolve.data.shards import read_column    # lazy: only sharded task splits
        self.split = split
        self.meta = split.meta
        self.g = int(split.meta["block_size"])
        self.n = len(split)
        self._whole = None
        seqs = [np.unique(read_column(p / "sequence.npy", "sequence"))
                for p in split.split.shard_paths()]
        self.answers = int(np.unique(np.concatenate(seqs)).size) if seqs else 0

    @property
    def n_blocks(self) -> int:
        return self.n // self.g

    def fixed_sums(self, progs) -> np.ndarray:
        payload = treeio.payload(progs)
        parts = self.split.backend.map_shards(shard_sums, [None] * len(self.split.split.shards),
                                              payload)
        return fixed.total(parts)

    def sums(self, progs) -> np.ndarray:
        return TL.from_fixed(self.fixed_sums(progs), self.n_blocks, self.answers)

    def whole(self) -> TaskData:
        """The whole split in this process (what the tuned baselines of a report read)."""
        if self._whole is None:
            ts = self.split.split.concat()
            self._whole = TaskData.of_columns(ts.columns, ts.meta)
        return self._whole


def shard_sums(shard, own, payload) -> np.ndarray:
    """One loaded shard's fixed-point block sums of the programs ``payload`` (runs
    where the shard is: ``evolve.cluster.worker.load_shard`` made its ``task``)."""
    return shard.task.fixed_sums(treeio.Programs(*payload))


def task_data(split):
    """The objectives' data of a task split: ``TaskData`` in memory, ``ShardedTaskData``
    for a sharded one (it has a backend)."""
    if getattr(split, "backend", None) is not None:
        return ShardedTaskData(split)
    return TaskData(split)


def metrics_of(rows) -> dict:
    """A split's metrics from one program's ``task_labels.sums`` row."""
    m = {k: float(v[0]) for k, v in TL.measures(np.atleast_2d(rows)).items()}
    m["fitness"] = float(TL.seed_fitness({k: np.array([v]) for k, v in m.items()})[0])
    return m
