"""A live run owns its directory: an OS advisory lock on the run directory itself.

``fcntl.flock`` on a descriptor of the directory is taken without waiting when
a run is created (on the directory still under its hidden name, so the run is
owned from the moment it appears) or resumed, and held until the process ends.
The OS drops it however the process ends (exit, exception, SIGKILL), so no
stale lock is ever left behind, and locking writes nothing into the directory.
A second process that tries to resume the same run meanwhile gets ``Busy``.
"""

from __future__ import annotations

import os


class Busy(Exception):
    """The directory is locked by another live process."""


class DirLock:
    def __init__(self, directory: str | os.PathLike):
        self.directory = directory
        self.fd: int | None = None

    def acquire(self) -> "DirLock":
        """Take the lock without waiting; ``Busy`` if another process holds it."""
        import fcntl    # lazy: fcntl exists on POSIX only
        fd = os.open(self.directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise Busy(str(self.directory)) from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)           # closing the descriptor drops the lock
            self.fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False
