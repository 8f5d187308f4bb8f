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
``force`` the file it replaces is first kept, complete, as ``<name>.previous``, or
when that exists as ``<name>.previous.1``, ``.previous.2``, ...: a kept copy is never
overwritten, so the user's original survives any number of ``--force``. ``-`` is not
a file name here (it would be a file named ``-``, not standard output): it is refused.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

from evolve.errors import EvolveError
from evolve.io.atomic import atomic_write_bytes, fsync_dir, naming, umask

PREVIOUS_SUFFIX = ".previous"
MAX_PREVIOUS = 1000                # kept copies of one file: .previous, .previous.1, ...


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
        raise OutputError.of(option, "an empty path is not allowed")
    if str(path) == "-":
        raise OutputError.of(option, f"'-' is not written to standard output; leave {option} "
                          "out to print there, or name a file (./- for a file named '-')")
    path = Path(path)
    parent = path.parent
    try:
        pst = os.stat(parent)
    except FileNotFoundError:
        raise OutputError.of(option, f"{path}: the directory {parent} does not exist "
                          "(it is not created)") from None
    except OSError as e:
        raise OutputError.of(option, f"{path}: cannot reach {parent} ({e.strerror})") from None
    if not stat.S_ISDIR(pst.st_mode):
        raise OutputError.of(option, f"{path}: {parent} is not a directory")
    real = Path(os.path.realpath(parent))
    for d in refuse_under:
        d = Path(os.path.realpath(d))
        if real == d or d in real.parents:
            raise OutputError.of(option, f"{path} is inside the heuristics directory {d}, "
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
        raise OutputError.of(option, f"{path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError.of(option, f"{path} is {_kind(st.st_mode)}; only a regular file "
                          "is written")
    if force is False:
        kept = next((p for p in previous_names(path) if not os.path.lexists(p)),
                    previous_path(path))
        raise OutputError.of(option, f"{path} exists; give --force to replace it (the old "
                          f"file is then kept as {kept.name})")


def write_new(option: str, path: Path, data: bytes, force: bool) -> Path | None:
    """Write ``data`` to ``path`` (checked by ``check_target``); returns the kept copy
    (``<name>.previous``, or ``.previous.1``, ... when that exists) when a file was
    replaced, else None."""
    path = Path(path)
    if not force:
        if _create([path], lambda fh: fh.write(data), 0o666 & ~umask()) is None:
            raise OutputError.of(option, f"{path} exists; give --force to replace it")
        return None
    kept = None
    if os.path.lexists(path):
        _check_file(option, path, True)          # still a regular file
        kept = _keep(option, path)
    atomic_write_bytes(path, data)
    return kept


def previous_names(path: Path):
    """Where ``--force`` keeps the file it replaces: ``<name>.previous``, then
    ``<name>.previous.1``, ... (the first that does not exist; none is overwritten)."""
    yield previous_path(path)
    for i in range(1, MAX_PREVIOUS):
        yield path.with_name(f"{path.name}{PREVIOUS_SUFFIX}.{i}")


def _create(names, write, mode: int) -> Path | None:
    """Create the first of ``names`` that does not exist, complete or not at all, with
    what ``write(fh)`` writes; None when every name exists. The data goes to a
    temporary file, which is then hard-linked to the name (which fails if the name
    exists), so a file that appeared since a check is never replaced."""
    names = [Path(n) for n in names]
    fd, tmp = tempfile.mkstemp(prefix=f".{names[0].name}.", suffix=".tmp",
                               dir=names[0].parent)
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fd, mode)
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as e:               # a full disk: name the file
            raise naming(e, names[0]) from None
        for name in names:
            try:
                os.link(tmp, name)
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV,
                                   errno.EMLINK):
                    raise
                if os.path.lexists(name):  # no hard links here: check, then rename
                    continue
                os.replace(tmp, name)
            fsync_dir(name.parent)
            return name
        return None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


def _keep(option: str, src: Path) -> Path:
    """Copy the regular file ``src`` to the first free name of ``previous_names``,
    complete or not at all (opened without following a link and without blocking,
    and checked once open)."""
    sfd = os.open(src, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(sfd, "rb") as sfh:
        st = os.fstat(sfd)
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{src} is {_kind(st.st_mode)}; only a regular file is kept")
        kept = _create(previous_names(src), lambda fh: shutil.copyfileobj(sfh, fh),
                       stat.S_IMODE(st.st_mode))
    if kept is None:
        raise OutputError.of(option, f"{src}: {MAX_PREVIOUS} kept copies "
                          f"({previous_path(src).name}, ...) exist already; move some away")
    return kept
