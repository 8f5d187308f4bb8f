"""Atomic file writes: temp file in the same directory, fsync, os.replace.

A reader sees either the old complete file or the new complete file, never a
torn one, whatever moment the writer dies at.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from evolve.io import jsonio


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write_with(path, lambda fh: fh.write(data))


def atomic_write_with(path: str | os.PathLike, write, mode: int | None = None) -> None:
    """Atomically replace ``path`` by what ``write(fh)`` writes to a binary file
    object; the file gets ``mode`` (default: 0o666 less the umask)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:      # closes fd on every path
            os.fchmod(fd, 0o666 & ~umask() if mode is None else mode)
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise naming(e, path) from None
    except BaseException:
        _remove(tmp)
        raise
    fsync_dir(path.parent)


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def naming(e: BaseException, path) -> BaseException:
    """``e``, or when it is an OSError that names no file (a write or an fsync on a
    full disk: "No space left on device"), the same error naming ``path``, so its
    one line says what failed."""
    if isinstance(e, OSError) and not e.filename and e.errno is not None:
        return OSError(e.errno, e.strerror or str(e), str(path))
    return e


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj, compact: bool = False) -> None:
    """Write JSON atomically: indented for people, or ``compact`` (one line, written
    by json's C encoder, several times faster) for machine state such as
    checkpoints, written every generation."""
    if compact:
        text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    else:
        text = json.dumps(obj, indent=2, sort_keys=False, allow_nan=False)
    atomic_write_text(path, text + "\n")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line and fsync it; a crash leaves at worst a torn last line."""
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        raise naming(e, path) from None


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def sync_filesystem(path: str | os.PathLike) -> None:
    """Flush everything written to the file system that holds ``path`` to disk, in
    one call: ``syncfs`` where the C library has it (Linux), else ``os.sync``. For a
    writer of many files (a shard set), instead of an fsync per file; a write error
    the kernel reports there is an OSError naming ``path``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        syncfs = _syncfs()
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(path))
    finally:
        os.close(fd)


def _syncfs():
    try:
        return ctypes.CDLL(None, use_errno=True).syncfs
    except (AttributeError, OSError):
        return None


def sha256_file(path: str | os.PathLike, chunk: int = 16 << 20) -> str:
    """sha256 of a file, read in ``chunk`` pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def keep_previous(path: Path, what: str, error) -> Path:
    """Before --force replaces a data file: keep it as <dir>/previous/<stem>-<sha256
    prefix><suffix> (a hard link where the file system allows, else a copy), so runs
    that recorded its checksum can still be resumed. A path that is not a regular
    file is ``error`` (jsonio.check_regular)."""
    path = Path(path)
    jsonio.check_regular(path, what, error)
    kept = path.parent / "previous" / f"{path.stem}-{sha256_file(path)[:16]}{path.suffix}"
    if not kept.exists():
        kept.parent.mkdir(exist_ok=True)
        tmp = kept.with_name(f".{kept.name}.tmp")
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        try:
            os.link(path, tmp)
        except OSError:
            shutil.copyfile(path, tmp)
        os.replace(tmp, kept)
    return kept
