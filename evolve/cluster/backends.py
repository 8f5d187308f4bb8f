"""Where shards are scored: every shard in this process, or one pinned task per
shard on a Dask cluster. Both return the exact fixed-point sums of a population
over all shards (``kernels.fixed.total``: any order, the same integers)."""

from __future__ import annotations

import time
import uuid

from evolve.cluster import ClusterError, ClusterInterrupted, worker
from evolve.data.shards import local_blocks
from evolve.kernels import fixed
from evolve.kernels.layout import TAIL_OFF
from evolve.lang import treeio

NO_WORKERS_GRACE_S = 60.0     # no worker at all for this long: the run stops
POLL_S = 2.0


def per_shard(split, blocks) -> list:
    """Global block numbers (sorted) -> each shard's local block numbers (None: all)."""
    return local_blocks([e["rows"] // split.block_size for e in split.shards], blocks)


class LocalShards:
    """Every shard loaded in this process, scored one after the other."""

    def __init__(self, split):
        self.split = split
        self.shards = [worker.load_shard(p, split.meta) for p in split.shard_paths()]
        self.comm_seconds = 0.0

    def map_shards(self, fn, per_shard_args: list, *args) -> list:
        """``fn(shard, per_shard_args[i], *args)`` for every shard i, in shard order."""
        return [fn(s, own, *args) for s, own in zip(self.shards, per_shard_args)]

    def sums(self, progs, with_kl: bool, blocks=None, tail_cap: float = TAIL_OFF):
        payload = treeio.payload(progs)
        return fixed.total(worker.score(s, payload, with_kl, 0, b, tail_cap) for s, b in
                           zip(self.shards, per_shard(self.split, blocks))
                           if b is None or b.size)

    def local_arrays(self) -> list:
        """Every shard's kernel arrays (``TraceArrays``), held in this process."""
        return [s.sa for s in self.shards]


class DaskShards:
    """One long-lived task per shard holds it (loaded once) on a worker; each call
    sends the linearised programs to every shard and adds the returned sums.

    A worker that dies loses its shards: the scheduler loads them again on the
    workers left (or on the worker's restart) and runs the lost scores again,
    up to Dask's ``allowed-failures``; past that, or with no worker left for
    ``NO_WORKERS_GRACE_S``, ClusterError (the run stops; its last checkpoint
    is intact and ``--resume`` continues exactly).

    Every wait has a limit (``session.LIMITS``): a call (loading the shards, or
    one generation's scores) that has not ended within ``EVOLVE_CLUSTER_CALL_TIMEOUT``
    is ClusterError, and once the run is asked to stop it gets at most
    ``EVOLVE_CLUSTER_STOP_GRACE`` seconds more (then ClusterInterrupted)."""

    def __init__(self, session, split):
        self.session = session
        self.client = client = session.client
        self.split = split
        self.threads = session.threads
        self.name = split.name
        workers = sorted(session.call(client.scheduler_info, "asking for its workers")["workers"])
        if not workers:
            raise ClusterError(f"{session.where}: no worker left; stopping")
        tag = uuid.uuid4().hex[:8]
        self.futures = [
            client.submit(worker.load_shard, str(p), split.meta, pure=False,
                          key=f"evolve-shard-{split.name}-{i}-{tag}",
                          workers=[workers[i % len(workers)]], allow_other_workers=True)
            for i, p in enumerate(split.shard_paths())]
        self._wait(self.futures, "loading the shards")
        for f in self.futures:
            if f.status == "error":
                self._raise(f)
        self.comm_seconds = 0.0     # wall time of calls beyond the busiest worker's kernels
        self.task_seconds: list = []   # the last call's kernel seconds, per shard

    def _wait(self, futs, what: str) -> list:
        """Wait for tasks and gather them; ClusterError when no worker has been left
        for NO_WORKERS_GRACE_S or the call limit passes (tasks that keep failing end
        as errors by themselves), ClusterInterrupted past the stop grace."""
        from distributed import wait    # lazy: start-up (Dask loads only where it is used)
        s = self.session
        what = f"shard set {self.name!r}, {what}"
        start = time.monotonic()
        deadline = start + s.limits["call"]
        stop_deadline = None
        alone_since = None

        def left() -> float:
            """Seconds left to this call (less once a stop is requested)."""
            nonlocal stop_deadline
            now = time.monotonic()
            if stop_deadline is None and s.stop():
                stop_deadline = now + s.limits["stop"]
            if stop_deadline is not None and now >= stop_deadline:
                raise ClusterInterrupted(f"{s.where}: {what}: not done within "
                                         f"{s.limits['stop']:g} s of the stop request "
                                         "(EVOLVE_CLUSTER_STOP_GRACE); abandoned")
            if now >= deadline:
                raise ClusterError(f"{s.where}: {what}: not done within "
                                   f"{s.limits['call']:g} s (EVOLVE_CLUSTER_CALL_TIMEOUT)")
            return min(deadline, stop_deadline or deadline) - now

        while True:
            t = left()
            try:
                s.call(lambda: wait(futs, timeout=min(POLL_S, t)), what,
                       limit_s=t + POLL_S, grace_s=t + POLL_S)
                break
            except TimeoutError:
                pass
            t = left()
            workers = s.call(s.client.scheduler_info, "asking for its workers",
                             limit_s=min(t, s.limits["connect"]), grace_s=t)
            if workers["workers"]:
                alone_since = None
            elif alone_since is None:
                alone_since = time.monotonic()
            elif time.monotonic() - alone_since > NO_WORKERS_GRACE_S:
                raise ClusterError(f"shard set {self.name!r}: no worker left for "
                                   f"{NO_WORKERS_GRACE_S:.0f} s; stopping")
        if futs is self.futures:
            return []
        for f in futs:
            if f.status == "error":
                self._raise(f)
        t = left()
        return s.call(lambda: self.client.gather(futs), what, limit_s=t, grace_s=t)

    def _raise(self, fut):
        exc = fut.exception()
        from distributed import KilledWorker    # lazy: start-up (Dask loads only where it is used)
        if isinstance(exc, KilledWorker):
            raise ClusterError(f"a worker died while scoring the {self.name} shards, more "
                               "often than distributed.scheduler.allowed-failures allows; "
                               "stopping")
        raise exc

    def map_shards(self, fn, per_shard_args: list, *args) -> list:
        """``fn(shard, per_shard_args[i], *args)`` for every shard i, each on the worker
        that holds the shard, in shard order, within the call's limits (``_wait``)."""
        futs = [self.client.submit(fn, f, own, *args, pure=False)
                for f, own in zip(self.futures, per_shard_args)]
        return self._wait(futs, "scoring")

    def local_arrays(self) -> None:
        """None: the shards are held by the workers, not in this process."""
        return None

    def sums(self, progs, with_kl: bool, blocks=None, tail_cap: float = TAIL_OFF):
        t0 = time.perf_counter()
        payload = treeio.payload(progs)
        futs = [self.client.submit(worker.timed_score, f, payload, with_kl, self.threads, b,
                                   tail_cap, pure=False)
                for f, b in zip(self.futures, per_shard(self.split, blocks))
                if b is None or b.size]
        results = self._wait(futs, "scoring")
        self.task_seconds = [t for _, t, _ in results]
        busy: dict = {}
        for _, t, proc in results:         # a worker runs its shards' tasks one by one
            busy[proc] = busy.get(proc, 0.0) + t
        self.comm_seconds += max(0.0, time.perf_counter() - t0 - max(busy.values()))
        return fixed.total(r for r, _, _ in results)
