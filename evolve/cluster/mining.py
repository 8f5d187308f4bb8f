"""Label mining on a Dask cluster (``evolve data task --cluster local:N`` or
``--scheduler ADDRESS``): the parts of a split (``evolve.data.sources.task.mining``)
handed to the workers.

Each worker holds one ``Miner`` (the traces, read from their path, and the pair,
rebuilt from the traces' meta as ``evolve simulate-task`` rebuilds it: the built-in
pair from its configuration, a Hugging Face pair's models loaded on the device the
configuration names), loaded once by a task pinned to it; the parts are dealt to the
workers in turn and each part's labels come back to this process, which writes the
part as it arrives. The workers read the traces from the same path as this process (one
machine, or a shared file system), and a worker whose file is not this process's
(checksum) is refused. An interrupted mining keeps the parts written; ``--resume``
mines the rest.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from evolve.cluster import ClusterError
from evolve.data import traces as T
from evolve.data.sources.task import mining
from evolve.data.sources.task import pair as TP


def load_miner(path: str, max_memory, seed: int):
    """A worker's ``Miner`` of the traces at ``path``: the pair rebuilt from their meta."""
    ts = T.load(path, name=Path(path).stem)
    return mining.Miner(TP.rebuild(ts.meta), path, max_memory, ts=ts, seed=seed)


def mine_part(miner, part):
    """(part, labels, cost, the traces' checksum) of one part, on the worker holding
    ``miner``."""
    labels, cost = miner.mine(tuple(part))
    return tuple(part), labels, cost, miner.sha


class DaskMining:
    """Parts mined on the workers of a connected ``evolve.cluster.session.Session``."""

    def __init__(self, session):
        self.session = session

    def mine(self, miner, parts: list):
        """Yield (part, labels, cost) of every part of ``parts``, as they finish."""
        if not parts:
            return
        from distributed import as_completed    # lazy: Dask loads only where it is used
        s = self.session
        client = s.connect()
        workers = sorted(s.call(client.scheduler_info, "asking for its workers")["workers"])
        if not workers:
            raise ClusterError(f"{s.where}: no worker left; stopping")
        tag = uuid.uuid4().hex[:8]
        held = [client.submit(load_miner, str(miner.path), miner.max_memory, miner.seed,
                              pure=False, key=f"evolve-miner-{miner.ts.name}-{i}-{tag}",
                              workers=[w], allow_other_workers=True)
                for i, w in enumerate(workers)]
        futs = [client.submit(mine_part, held[i % len(workers)], list(part), pure=False,
                              key=f"evolve-mine-{miner.ts.name}-{part[0]}-{tag}",
                              workers=[workers[i % len(workers)]], allow_other_workers=True)
                for i, part in enumerate(parts)]
        try:
            for fut in as_completed(futs):
                if fut.status == "error":
                    exc = fut.exception()
                    raise ClusterError(f"{s.where}: mining {miner.ts.name} part "
                                       f"{fut.key.rsplit('-', 2)[-2]} failed on a worker "
                                       f"({type(exc).__name__}: {str(exc)[:200]})")
                part, labels, cost, sha = fut.result()
                if sha != miner.sha:
                    raise ClusterError(f"{s.where}: a worker reads other traces at "
                                       f"{miner.path} (checksum differs): the workers must "
                                       "see this process's files")
                yield part, labels, cost
        finally:
            client.cancel(futs + held)
