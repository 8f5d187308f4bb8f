"""Where a run's sharded splits are evaluated: this process, a ``LocalCluster``
(``--cluster local:N``) or an existing scheduler (``--scheduler ADDRESS``).

``Session.attach`` wraps sharded splits (``evolve.data.shards.ShardedSplit``)
in ``ClusterSplit``, which the trace objectives evaluate through
(``ClusterSplit.evaluator``): the engine, the hall of fame and the champion's
metrics then run on the shards. Splits that are not sharded are returned as
they are (in-process, as always); a cluster needs sharded splits.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from evolve.cluster import INSTALL, ClusterError
from evolve.objectives.spec import TAIL_OFF

CONNECT_TIMEOUT_S = 10


def parse_cluster(spec: str) -> int:
    """``local:N`` -> N (workers of a LocalCluster on this machine)."""
    kind, _, n = spec.partition(":")
    if kind != "local" or not n.isdigit() or int(n) < 1:
        raise ClusterError(f"--cluster: {spec!r} is invalid; expected local:N with N >= 1 "
                           "(or --scheduler ADDRESS for an existing cluster)")
    return int(n)


class ClusterSplit:
    """A sharded split and the backend that scores it (duck-types the split API the
    runner and the trace objectives read)."""

    def __init__(self, split, backend):
        self.split = split
        self.backend = backend
        self.meta = split.meta
        self.name = split.name
        self._arrays = None

    def __len__(self) -> int:
        return len(self.split)

    def content_digest(self) -> str:
        return self.split.content_digest()

    @property
    def n_blocks(self) -> int:
        return self.split.n_blocks

    def sums(self, progs, with_kl: bool = True, blocks=None,
             tail_cap: float = TAIL_OFF) -> np.ndarray:
        """float64 kernel sums (P, 6 + 3g) over every shard (or over the blocks
        ``blocks``), exact (see kernels.fixed)."""
        from evolve.kernels import fixed
        return fixed.to_float(self.backend.sums(progs, with_kl, blocks, tail_cap))

    def evaluator(self, name: str, blocks=None, with_kl: bool = False,
                  tail_cap: float = TAIL_OFF):
        """The split's evaluator; ``batch(blocks)`` gives one over some of its blocks."""
        from evolve.objectives.base import Evaluator
        g, k = int(self.meta["block_size"]), int(self.meta["top_k"])
        shape = Shape(g, k, len(self.split) if blocks is None else len(blocks) * g)
        ev = Evaluator(name, lambda progs: self.sums(progs, with_kl, blocks, tail_cap), shape,
                       shape.n * shape.k)
        ev.batch = lambda b: self.evaluator(f"{name} batch", b, with_kl, tail_cap)
        return ev

    def spec_arrays(self):
        """The whole split's SpecArrays in this process (finishing reports only)."""
        if self._arrays is None:
            from evolve.cluster.worker import kernel_arrays
            self._arrays = kernel_arrays(self.split.concat())
        return self._arrays


class Shape:
    """What the objectives read of a split they do not hold: g, k, rows, blocks."""

    def __init__(self, g: int, k: int, n: int):
        self.g, self.k, self.n = g, k, n

    @property
    def n_blocks(self) -> int:
        return self.n // self.g


class Session:
    """Evaluation backends for a run; ``close`` stops what it started."""

    def __init__(self, cluster: str | None = None, scheduler: str | None = None,
                 threads: int = 0):
        if cluster and scheduler:
            raise ClusterError("--cluster and --scheduler: give one of them")
        self.n_local = parse_cluster(cluster) if cluster else 0
        self.scheduler = scheduler
        self.threads = threads
        self.client = None
        self._cluster = None

    @property
    def distributed(self) -> bool:
        return bool(self.n_local or self.scheduler)

    def attach(self, splits: dict) -> dict:
        from evolve.data.shards import ShardedSplit
        sharded = {k: v for k, v in splits.items() if isinstance(v, ShardedSplit)}
        if not sharded:
            if self.distributed:
                opt = "--cluster" if self.n_local else "--scheduler"
                raise ClusterError(f"{opt}: needs sharded traces (make them with `evolve data "
                                   "shard DIR --rows-per-shard N`, then --data DIR/shards)")
            return splits
        from evolve.cluster.backends import DaskShards, LocalShards
        if self.distributed:
            from evolve.cluster.worker import warm
            warm(next(iter(sharded.values())).shard(0))     # workers then read the cache
            client = self.connect()
            make = lambda sp: DaskShards(client, sp, self.threads)   # noqa: E731
        else:
            make = LocalShards
        return {k: (ClusterSplit(v, make(v)) if k in sharded else v) for k, v in splits.items()}

    def connect(self):
        if self.client is not None:
            return self.client
        try:
            import distributed
        except ImportError:
            opt = "--cluster" if self.n_local else "--scheduler"
            raise ClusterError(f"{opt}: needs dask[distributed]; install it with: "
                               f"{INSTALL}") from None
        try:
            if self.n_local:
                threads = self.threads or max(1, (os.cpu_count() or 1) // self.n_local)
                self.threads = threads
                import dask
                with dask.config.set({"distributed.scheduler.work-stealing": False}):
                    # memory_limit=0: workers hold their shards by design; Dask's
                    # default (the machine's memory split evenly) restarts a worker
                    # whose shards outgrow its share, and then loads them again
                    self._cluster = distributed.LocalCluster(
                        n_workers=self.n_local, threads_per_worker=1, processes=True,
                        dashboard_address=":0", silence_logs=logging.CRITICAL,
                        memory_limit=0)
                self.client = distributed.Client(self._cluster)
            else:
                self.client = distributed.Client(self.scheduler, timeout=CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as e:
            self.close()
            where = (f"--scheduler: {self.scheduler}" if self.scheduler
                     else f"--cluster: local:{self.n_local}")
            raise ClusterError(f"{where}: cannot start or reach the cluster "
                               f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e})"
                               ) from None
        if not self.client.scheduler_info().get("workers"):
            try:
                self.client.wait_for_workers(1, timeout=CONNECT_TIMEOUT_S)
            except (TimeoutError, OSError):
                self.close()
                raise ClusterError(f"--scheduler: {self.scheduler}: no workers joined within "
                                   f"{CONNECT_TIMEOUT_S} s") from None
        return self.client

    def close(self) -> None:
        for obj in (self.client, self._cluster):
            if obj is not None:
                try:
                    obj.close()
                except Exception:      # closing a cluster that already failed
                    pass
        self.client = self._cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
