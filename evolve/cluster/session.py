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
import math
import os
import re
import signal
import threading
import time

import numpy as np

from evolve.cluster import INSTALL, ClusterError, ClusterInterrupted
from evolve.errors import first_line, show
from evolve.kernels.layout import TAIL_OFF
from evolve.kernels import fixed
from evolve.objectives.base import Evaluator
from evolve.cluster.worker import kernel_arrays
from evolve.data.shards import ShardedSplit
from evolve.data.decode import slots_missing
from evolve.cluster.worker import warm
from multiprocessing import resource_tracker
from evolve.cluster.backends import DaskShards, LocalShards

# Every wait on a scheduler has a limit (seconds), each settable in the environment:
LIMITS = {
    # reaching the scheduler: connection, handshake, identity, a worker to join
    "connect": ("EVOLVE_CLUSTER_CONNECT_TIMEOUT", 30.0),
    # one call of a generation (every shard scored and gathered), or loading the shards
    "call": ("EVOLVE_CLUSTER_CALL_TIMEOUT", 3600.0),
    # after SIGINT/SIGTERM, how long a generation in flight may still take to finish
    # before it is abandoned (the run then stops at its last checkpoint)
    "stop": ("EVOLVE_CLUSTER_STOP_GRACE", 30.0),
}
MAX_LIMIT_S = 1e6
CLOSE_S = 10.0              # closing the client and a LocalCluster
SCHEMES = ("tcp", "tls")    # what --scheduler may name (bare HOST:PORT is tcp)
MAX_ADDRESS_CHARS = 400
_LOCAL = re.compile(r"local:([0-9]{1,9})", re.ASCII)
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)
_HOST = re.compile(r"[A-Za-z0-9_.-]{1,253}", re.ASCII)
_HOST6 = re.compile(r"\[[0-9A-Fa-f:.]{2,45}\]", re.ASCII)


def limit(which: str) -> float:
    """The limit (seconds) of one kind of wait: its environment variable, or the default."""
    var, default = LIMITS[which]
    text = os.environ.get(var)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_LIMIT_S):
        raise ClusterError(f"{var}: {show(text, 80)} is invalid; expected seconds, a number "
                           f"> 0 and <= {MAX_LIMIT_S:.0f}")
    return value


def max_local_workers() -> int:
    """The most workers ``--cluster local:N`` starts: four per core (at least 4)."""
    return max(4, 4 * (os.cpu_count() or 1))


def parse_cluster(spec: str) -> int:
    """``local:N`` -> N (workers of a LocalCluster on this machine)."""
    m = _LOCAL.fullmatch(spec) if isinstance(spec, str) else None
    if m is None or int(m[1]) < 1:
        raise ClusterError(f"--cluster: {show(spec, 80)} is invalid; expected local:N with N >= 1 "
                           "(or --scheduler ADDRESS for an existing cluster)")
    n, most = int(m[1]), max_local_workers()
    if n > most:
        raise ClusterError(f"--cluster: {show(spec, 80)} is invalid; at most local:{most} on this "
                           f"machine ({os.cpu_count() or 1} cores)")
    return n


def parse_scheduler(address: str) -> str:
    """``[SCHEME://]HOST:PORT`` -> the address to connect to (bare HOST:PORT is tcp).
    Only tcp and tls: other transports need packages this project does not install."""
    def bad(why: str):
        return ClusterError(f"--scheduler: {show(address, 80)} is invalid; {why} (expected "
                            "tcp://HOST:PORT, tls://HOST:PORT or HOST:PORT)")
    if not isinstance(address, str) or not address.strip():
        raise bad("an empty value is not allowed")
    if len(address) > MAX_ADDRESS_CHARS:
        raise bad(f"longer than {MAX_ADDRESS_CHARS} characters")
    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in SCHEMES:
        raise bad(f"the scheme {scheme!r} is not supported")
    host, colon, port = rest.rpartition(":")
    if not colon or not _PORT.fullmatch(port) or not 1 <= int(port) <= 65535:
        raise bad("the port must be a number from 1 to 65535")
    if not (_HOST.fullmatch(host) or _HOST6.fullmatch(host)):
        raise bad("the host must be a name or an IP address")
    return f"{scheme}://{host}:{int(port)}"


def check_options(cluster: str | None, scheduler: str | None) -> None:
    """``--cluster`` and ``--scheduler`` as given (None: not given): one-line ClusterError."""
    if cluster is not None and scheduler is not None:
        raise ClusterError("--cluster and --scheduler: give one of them")
    if cluster is not None:
        parse_cluster(cluster)
    if scheduler is not None:
        parse_scheduler(scheduler)
    if cluster is not None or scheduler is not None:
        for which in LIMITS:
            limit(which)


def bounded(fn, limit_s: float, timeout_message: str, stop=None, grace_s: float = 0.0,
            stopped_message: str = "", block_sigint: bool = False):
    """``fn()`` in a daemon thread, waited for at most ``limit_s`` seconds (then
    ClusterError ``timeout_message``). Once ``stop()`` is true, at most ``grace_s``
    more (then ClusterInterrupted ``stopped_message``). A call that never returns
    (a scheduler that accepts and never answers) is left behind in its thread. A
    limit passed after the stop request is ClusterInterrupted too.

    ``block_sigint``: the thread blocks SIGINT, and so do the threads it starts and
    the processes those start (a LocalCluster's workers: the terminal's Ctrl-C,
    sent to the whole process group, is for this process, which owns the stop)."""
    box: dict = {}

    def target():
        if block_sigint:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            box["value"] = fn()
        except BaseException as e:          # handed to the waiting thread
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name="evolve cluster wait")
    thread.start()
    now = time.monotonic()
    deadline, stop_deadline = now + limit_s, None
    while thread.is_alive():
        thread.join(0.1)
        now = time.monotonic()
        if not thread.is_alive():
            break
        if stop is not None and stop() and stop_deadline is None:
            stop_deadline = now + grace_s
        if stop_deadline is not None and now >= stop_deadline:
            raise ClusterInterrupted(stopped_message)
        if now >= deadline:        # once a stop is requested, the stop's own message
            raise (ClusterInterrupted(stopped_message) if stop_deadline is not None
                   else ClusterError(timeout_message))
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _one_line(e: BaseException) -> str:
    """The error's type and the first line of its text (what connecting raised)."""
    first = first_line(e, 200)
    return type(e).__name__ if first == type(e).__name__ else f"{type(e).__name__}: {first}"


class ClusterSplit:
    """A sharded split and the backend that scores it (duck-types the split API the
    runner and the trace objectives read)."""

    def __init__(self, split, backend):
        self.split = split
        self.backend = backend
        self.meta = split.meta
        self.name = split.name
        self._arrays = None
        self._missing = None

    def __len__(self) -> int:
        return len(self.split)

    def content_digest(self) -> str:
        return self.split.content_digest()

    @property
    def n_blocks(self) -> int:
        return self.split.n_blocks

    @property
    def missing(self) -> str:
        """Why the shards have no slot features ("" when they have them): the
        definition ``TraceArrays.missing`` applies to each shard, read off shard 0 (the
        shards of one split share a schema)."""
        if self._missing is None:
            self._missing = (slots_missing(self.split.shard(0).columns, self.name)
                             if self.split.shards else "")
        return self._missing

    @property
    def shape(self) -> "Shape":
        """g, k, rows and blocks of the whole split, and whether it has slot features."""
        return Shape(int(self.meta["block_size"]), int(self.meta["top_k"]), len(self.split),
                     self.missing)

    def sums(self, progs, with_kl: bool = True, blocks=None,
             tail_cap: float = TAIL_OFF) -> np.ndarray:
        """float64 kernel sums (P, 6 + 3g) over every shard (or over the blocks
        ``blocks``), exact (see kernels.fixed)."""
        return fixed.to_float(self.backend.sums(progs, with_kl, blocks, tail_cap))

    def evaluator(self, name: str, blocks=None, with_kl: bool = False,
                  tail_cap: float = TAIL_OFF):
        """The split's evaluator; ``batch(blocks)`` gives one over some of its blocks."""
        g, k = int(self.meta["block_size"]), int(self.meta["top_k"])
        shape = Shape(g, k, len(self.split) if blocks is None else len(blocks) * g,
                      self.missing)
        return Evaluator(name, lambda progs: self.sums(progs, with_kl, blocks, tail_cap), shape,
                         shape.n * shape.k,
                         batch=lambda b: self.evaluator(f"{name} batch", b, with_kl, tail_cap))

    def local_arrays(self):
        """Every shard's TraceArrays when the shards are held in this process (else None:
        on a cluster the workers hold them)."""
        return self.backend.local_arrays()

    def spec_arrays(self):
        """The whole split's TraceArrays in this process (finishing reports only)."""
        if self._arrays is None:
            self._arrays = kernel_arrays(self.split.concat())
        return self._arrays


class Shape:
    """What the objectives read of a split they do not hold: g, k, rows, blocks, and
    ``missing``: why it has no slot features, "" when it has them (``TraceArrays.missing``)."""

    def __init__(self, g: int, k: int, n: int, missing: str):
        self.g, self.k, self.n, self.missing = g, k, n, missing

    @property
    def n_blocks(self) -> int:
        return self.n // self.g


class Session:
    """Evaluation backends for a run; ``close`` stops what it started.

    ``stop``: a callable, true once the run has been asked to stop (SIGINT or
    SIGTERM): a wait to reach the scheduler then ends at once, and a generation
    in flight gets ``EVOLVE_CLUSTER_STOP_GRACE`` seconds more to finish."""

    def __init__(self, cluster: str | None = None, scheduler: str | None = None,
                 threads: int = 0, stop=None):
        check_options(cluster, scheduler)
        self.n_local = parse_cluster(cluster) if cluster is not None else 0
        self.scheduler = scheduler
        self.address = parse_scheduler(scheduler) if scheduler is not None else None
        self.threads = threads
        self.stop = stop or (lambda: False)
        self.limits = {which: limit(which) for which in LIMITS} if self.distributed else {}
        self.client = None
        self._cluster = None

    @property
    def distributed(self) -> bool:
        return bool(self.n_local or self.scheduler)

    @property
    def where(self) -> str:
        return (f"--scheduler: {self.scheduler}" if self.scheduler is not None
                else f"--cluster: local:{self.n_local}")

    def attach(self, splits: dict) -> dict:
        sharded = {k: v for k, v in splits.items() if isinstance(v, ShardedSplit)}
        if not sharded:
            if self.distributed:
                opt = "--cluster" if self.n_local else "--scheduler"
                raise ClusterError(f"{opt}: needs sharded traces (make them with `evolve data "
                                   "shard DIR --rows-per-shard N`, then --data DIR/shards)")
            return splits
        if self.distributed:
            warm(next(iter(sharded.values())).shard(0))     # workers then read the cache
            self.connect()
            make = lambda sp: DaskShards(self, sp)     # noqa: E731
        else:
            make = LocalShards
        return {k: (ClusterSplit(v, make(v)) if k in sharded else v) for k, v in splits.items()}

    def call(self, fn, what: str, limit_s: float | None = None, grace_s: float | None = None):
        """``fn()`` (a call that waits on the scheduler) within the connect limit (or
        ``limit_s``); a stop request ends it at once (or after ``grace_s``)."""
        var = LIMITS["connect"][0]
        limit_s = self.limits["connect"] if limit_s is None else limit_s
        return bounded(fn, limit_s,
                       f"{self.where}: {what}: no answer within {limit_s:g} s ({var})",
                       stop=self.stop, grace_s=0.0 if grace_s is None else grace_s,
                       stopped_message=f"{self.where}: interrupted while waiting for the "
                                       f"cluster ({what}); nothing was changed")

    def connect(self):
        if self.client is not None:
            return self.client
        try:
            import distributed    # lazy: start-up (Dask loads only where it is used)
        except ImportError:
            opt = "--cluster" if self.n_local else "--scheduler"
            raise ClusterError(f"{opt}: needs dask[distributed]; install it with: "
                               f"{INSTALL}") from None
        try:
            if self.n_local:
                self.threads = self.threads or max(1, (os.cpu_count() or 1) // self.n_local)
                # started here: starting it later, from a thread that blocks SIGINT,
                # would unblock it there (multiprocessing does so once it has spawned)
                resource_tracker.ensure_running()
                bounded(self._start_local, self.limits["connect"] + 60.0,
                        f"{self.where}: the workers did not start within "
                        f"{self.limits['connect'] + 60.0:g} s", stop=self.stop,
                        stopped_message=f"{self.where}: interrupted while starting the "
                                        "workers; nothing was changed",
                        block_sigint=True)
            else:
                t = self.limits["connect"]
                self.client = self.call(lambda: distributed.Client(
                    self.address, timeout=t), "connecting")
            if not self.call(lambda: self.client.scheduler_info().get("workers"),
                             "asking for its workers"):
                try:
                    self.call(lambda: self.client.wait_for_workers(
                        1, timeout=self.limits["connect"]), "waiting for a worker",
                        limit_s=self.limits["connect"] + 5.0)
                except TimeoutError:
                    raise ClusterError(f"{self.where}: no workers joined within "
                                       f"{self.limits['connect']:g} s") from None
        except (ClusterError, KeyboardInterrupt):
            self.close()
            raise
        except Exception as e:         # anything connecting may raise: one line
            self.close()
            raise ClusterError(f"{self.where}: cannot start or reach the cluster "
                               f"({_one_line(e)})") from None
        return self.client

    def _start_local(self) -> None:
        """A LocalCluster and its client (in a thread that blocks SIGINT: see bounded)."""
        import dask    # lazy: start-up (Dask loads only where it is used)
        import distributed    # lazy: start-up (Dask loads only where it is used)
        with dask.config.set({"distributed.scheduler.work-stealing": False}):
            # memory_limit=0: workers hold their shards by design; Dask's
            # default (the machine's memory split evenly) restarts a worker
            # whose shards outgrow its share, and then loads them again.
            # preload: each worker also ignores SIGINT (see worker.dask_setup)
            self._cluster = distributed.LocalCluster(
                n_workers=self.n_local, threads_per_worker=1, processes=True,
                dashboard_address=":0", silence_logs=logging.CRITICAL,
                memory_limit=0, preload=["evolve.cluster.worker"])
        self.client = distributed.Client(self._cluster)

    def close(self) -> None:
        """Close the client and the LocalCluster, each within CLOSE_S (a scheduler
        that no longer answers is left behind)."""
        for obj in (self.client, self._cluster):
            if obj is not None:
                try:
                    bounded(obj.close, CLOSE_S, "close")
                except Exception:      # closing a cluster that already failed
                    pass
        self.client = self._cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
