"""Evaluation over sharded traces, in this process or on a Dask cluster.

A population's trace objectives are additive over blocks, and the kernel sums
them exactly (``evolve.kernels.fixed``), so a split can be cut into shards
(``evolve.data.shards``), each shard scored where it lives and the integer sums
added: the result is the same bit for bit for any number of shards and
workers, and the same as the in-process kernel on the whole split.

- ``worker.py``: what runs next to a shard: load it once (memory-mapped
  columns, then the kernel's arrays), score linearised programs.
- ``backends.py``: ``LocalShards`` (every shard in this process) and
  ``DaskShards`` (one pinned task per shard holds it on a worker; each
  generation sends only the programs and adds the returned sums).
- ``session.py``: ``--cluster local:N`` (a ``LocalCluster``) or ``--scheduler
  ADDRESS`` (an existing one), the Numba cache warmed here first, and the
  sharded splits wrapped so the trace objectives evaluate through them. Every
  wait on the scheduler has a limit (``session.LIMITS``) and ends on SIGINT or
  SIGTERM; a LocalCluster's workers ignore SIGINT (the terminal sends it to the
  whole process group; this process owns the stop).

Dask is an optional dependency (``pip install -e '.[cluster]'``), imported only
when a cluster is asked for.
"""


from evolve.errors import EvolveError


class ClusterError(EvolveError, RuntimeError):
    """The cluster cannot be reached or lost the workers it needed; one line. (An
    ``EvolveError``, so the command line reports it in one line, and still the
    ``RuntimeError`` it always was.)"""


class ClusterInterrupted(ClusterError):
    """SIGINT/SIGTERM ended a wait on the cluster (connecting, or a generation that
    did not finish within the stop grace); the run stops at its last checkpoint."""


INSTALL = "pip install -e '.[cluster]'"
