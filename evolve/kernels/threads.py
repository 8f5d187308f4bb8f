"""Threads over the work items of a nogil kernel.

The population kernels are compiled without ``parallel=True``: a kernel is a plain
``nogil`` function over a range of work items (a chunk or group of programs), and
``run`` calls it from ``numba.get_num_threads()`` threads, each taking the next item
when done, so programs of very different cost, or a core shared with another
process, do not leave a thread idle. Each program's results are its own, so they do
not depend on the thread count or the schedule. (Numba's parallel loops did the same
but cost seconds of compilation per kernel on a fresh machine, and a few
milliseconds to start a call on this machine's threading layer.)
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_size = 0


def _executor(workers: int) -> ThreadPoolExecutor:
    global _pool, _size
    with _lock:
        if _pool is None or _size < workers:
            if _pool is not None:
                _pool.shutdown(wait=False)
            _pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="evolve-kernel")
            _size = workers
        return _pool


def _forget_pool() -> None:
    """A forked child has none of its parent's threads: it starts its own pool."""
    global _pool, _size, _lock
    _pool, _size, _lock = None, 0, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def run(kernel, n_items: int, *args) -> None:
    """``kernel(i0, i1, *args)`` over items 0..n_items, one item at a time per thread."""
    import numba    # lazy: start-up (Numba loads only where it is used)
    threads = min(numba.get_num_threads(), n_items)
    if threads <= 1:
        kernel(0, n_items, *args)
        return
    items = itertools.count()          # next() of a count is atomic under the GIL

    def work():
        for i in iter(items.__next__, None):
            if i >= n_items:
                return
            kernel(i, i + 1, *args)

    pool = _executor(threads - 1)
    futures = [pool.submit(work) for _ in range(threads - 1)]
    work()                               # the calling thread works too
    for f in futures:
        f.result()
