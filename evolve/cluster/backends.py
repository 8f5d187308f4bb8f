"""Where shards are scored: every shard in this process, or one pinned task per
shard on a Dask cluster. Both return the exact fixed-point sums of a population
over all shards (``kernels.fixed.total``: any order, the same integers)."""

from __future__ import annotations

import time
import uuid

import numpy as np

from evolve.cluster import ClusterError, worker
from evolve.kernels import fixed
from evolve.objectives.spec import TAIL_OFF

NO_WORKERS_GRACE_S = 60.0     # no worker at all for this long: the run stops
POLL_S = 2.0


def per_shard(split, blocks) -> list:
    """Global block numbers (sorted) -> each shard's local block numbers (None: all)."""
    if blocks is None:
        return [None] * len(split.shards)
    g = split.block_size
    edges = np.cumsum([0] + [e["rows"] // g for e in split.shards])
    blocks = np.asarray(blocks, dtype=np.int64)
    return [blocks[(blocks >= a) & (blocks < b)] - a for a, b in zip(edges[:-1], edges[1:])]


class LocalShards:
    """Every shard loaded in this process, scored one after the other."""

    def __init__(self, split):
        self.split = split
        self.shards = [worker.load_shard(p, split.meta) for p in split.shard_paths()]
        self.comm_seconds = 0.0

    def sums(self, progs, with_kl: bool, blocks=None, tail_cap: float = TAIL_OFF):
        payload = worker.programs_payload(progs)
        return fixed.total(worker.score(s, payload, with_kl, 0, b, tail_cap) for s, b in
                           zip(self.shards, per_shard(self.split, blocks))
                           if b is None or b.size)


class DaskShards:
    """One long-lived task per shard holds it (loaded once) on a worker; each call
    sends the linearised programs to every shard and adds the returned sums.

    A worker that dies loses its shards: the scheduler loads them again on the
    workers left (or on the worker's restart) and runs the lost scores again,
    up to Dask's ``allowed-failures``; past that, or with no worker left for
    ``NO_WORKERS_GRACE_S``, ClusterError (the run stops; its last checkpoint
    is intact and ``--resume`` continues exactly)."""

    def __init__(self, client, split, threads: int = 0):
        self.client = client
        self.split = split
        self.threads = threads
        self.name = split.name
        workers = sorted(client.scheduler_info()["workers"])
        tag = uuid.uuid4().hex[:8]
        self.futures = [
            client.submit(worker.load_shard, str(p), split.meta, pure=False,
                          key=f"evolve-shard-{split.name}-{i}-{tag}",
                          workers=[workers[i % len(workers)]], allow_other_workers=True)
            for i, p in enumerate(split.shard_paths())]
        self._wait(self.futures)
        for f in self.futures:
            if f.status == "error":
                self._raise(f)
        self.comm_seconds = 0.0     # wall time of calls beyond the busiest worker's kernels
        self.task_seconds: list = []   # the last call's kernel seconds, per shard

    def _wait(self, futs) -> None:
        """Wait for tasks; ClusterError when no worker has been left for
        NO_WORKERS_GRACE_S (tasks that keep failing end as errors by themselves)."""
        from distributed import wait
        alone_since = None
        while True:
            try:
                wait(futs, timeout=POLL_S)
                return
            except TimeoutError:
                pass
            if self.client.scheduler_info()["workers"]:
                alone_since = None
            elif alone_since is None:
                alone_since = time.perf_counter()
            elif time.perf_counter() - alone_since > NO_WORKERS_GRACE_S:
                raise ClusterError(f"shard set {self.name!r}: no worker left for "
                                   f"{NO_WORKERS_GRACE_S:.0f} s; stopping")

    def _raise(self, fut):
        exc = fut.exception()
        from distributed import KilledWorker
        if isinstance(exc, KilledWorker):
            raise ClusterError(f"a worker died while scoring the {self.name} shards, more "
                               "often than distributed.scheduler.allowed-failures allows; "
                               "stopping")
        raise exc

    def sums(self, progs, with_kl: bool, blocks=None, tail_cap: float = TAIL_OFF):
        t0 = time.perf_counter()
        payload = worker.programs_payload(progs)
        futs = [self.client.submit(worker.timed_score, f, payload, with_kl, self.threads, b,
                                   tail_cap, pure=False)
                for f, b in zip(self.futures, per_shard(self.split, blocks))
                if b is None or b.size]
        self._wait(futs)
        for f in futs:
            if f.status == "error":
                self._raise(f)
        results = self.client.gather(futs)
        self.task_seconds = [t for _, t, _ in results]
        busy: dict = {}
        for _, t, proc in results:         # a worker runs its shards' tasks one by one
            busy[proc] = busy.get(proc, 0.0) + t
        self.comm_seconds += max(0.0, time.perf_counter() - t0 - max(busy.values()))
        return fixed.total(r for r, _, _ in results)

