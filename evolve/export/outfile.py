"""Files a command writes for the user: ``export --out`` and ``tradeoff --png``.

``check_target`` refuses, in one line naming the option and the path, what must not
be written: an empty path, a missing parent directory (never created), a parent that
is not a directory, and a path that is a directory, a symbolic link (never written
through) or any other file that is not a regular file (a FIFO, a device, a socket).
``export --out`` also refuses an existing file unless ``--force``, and any path inside
the heuristics directory: ``heuristics/evolved.py`` and ``evolved_trace.py`` belong
to write-back (its lock and its ``history/``), the rest of that directory is the
package's own code, and an exported module is neither.

``write_new`` writes atomically (``evolve.io.atomic``): without ``force`` the file
appears complete or not at all and never replaces one that appeared meanwhile; with
``force`` the file it replaces is first kept, complete, as ``<name>.previous``.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from evolve.errors import EvolveError
from evolve.io.atomic import atomic_write_bytes, atomic_write_with, fsync_dir, naming, umask

PREVIOUS_SUFFIX = ".previous"


class OutputError(EvolveError):
    """A path a command must not write (one line, naming the option and the path)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def previous_path(path: Path) -> Path:
    return path.with_name(path.name + PREVIOUS_SUFFIX)


def check_target(option: str, path, force: bool | None = None, refuse_under=()) -> Path:
    """``path`` as a Path when a command may write it, else OutputError. ``force``:
    None lets an existing regular file be replaced; False refuses it; True allows it
    (and ``<name>.previous`` must then be writable too). ``refuse_under``: directories
    inside which nothing may be written."""
    if path is None or not str(path).strip():
        raise OutputError(f"{option}: an empty path is not allowed")
    path = Path(path)
    parent = path.parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise OutputError(f"{option}: {path}: the directory {parent} does not exist "
                          "(it is not created)") from None
    except OSError as e:
        raise OutputError(f"{option}: {path}: cannot reach {parent} ({e.strerror})") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise OutputError(f"{option}: {path}: {parent} is not a directory")
    real = Path(os.path.realpath(parent))
    for d in refuse_under:
        d = Path(os.path.realpath(d))
        if real == d or d in real.parents:
            raise OutputError(f"{option}: {path} is inside the heuristics directory {d}, "
                              "which write-back manages; write the module elsewhere")
    _check_file(option, path, force)
    if force:
        _check_file(option, previous_path(path), None)
    return path


def _check_file(option: str, path: Path, force: bool | None) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise OutputError(f"{option}: {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{option}: {path} is {_kind(st.st_mode)}; only a regular file "
                          "is written")
    if force is False:
        raise OutputError(f"{option}: {path} exists; give --force to replace it (the old "
                          f"file is then kept as {previous_path(path).name})")


def write_new(option: str, path: Path, data: bytes, force: bool) -> Path | None:
    """Write ``data`` to ``path`` (checked by ``check_target``); returns the kept
    ``<name>.previous`` when a file was replaced, else None."""
    path = Path(path)
    if not force:
        _link_new(option, path, data)
        return None
    kept = None
    if os.path.lexists(path):
        _check_file(option, path, True)          # still a regular file
        kept = previous_path(path)
        _copy_atomic(path, kept)
    atomic_write_bytes(path, data)
    return kept


def _link_new(option: str, path: Path, data: bytes) -> None:
    """Create ``path`` complete or not at all, never replacing a file that appeared
    since the check: the data goes to a temporary file, which is then hard-linked to
    the name (which fails if the name exists)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fd, 0o666 & ~umask())
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as e:               # a full disk: name the file
            raise naming(e, path) from None
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise OutputError(f"{option}: {path} exists; give --force to replace it") from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                               errno.EMLINK):
                raise
            if os.path.lexists(path):      # no hard links here: check, then rename
                raise OutputError(f"{option}: {path} exists; give --force to replace "
                                  "it") from None
            os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    fsync_dir(path.parent)


def _copy_atomic(src: Path, dst: Path) -> None:
    """Copy the regular file ``src`` to ``dst`` atomically (opened without following
    a link and without blocking, and checked once open)."""
    sfd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(sfd, "rb") as sfh:
        st = os.fstat(sfd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{src} is {_kind(st.st_mode)}; only a regular file is kept")
        atomic_write_with(dst, lambda fh: shutil.copyfileobj(sfh, fh), stat.S_IMODE(st.st_mode))
