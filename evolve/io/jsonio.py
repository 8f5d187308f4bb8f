"""Reading untrusted files: regular files only, a byte cap, one JSON parser.

Everything the project reads back from disk (run files, ``history.jsonl``
lines, data splits in JSON form, the ``meta.json`` of split files) goes
through here, so the limits and the one-line errors are the same everywhere:

- only regular files are read: a FIFO, a device or a directory (also behind a
  symlink) is refused before it is opened, so a read can neither hang nor run
  without end;
- a file is read with a byte cap (never its whole length first);
- JSON text may nest at most ``MAX_DEPTH`` levels, hold integers of at most
  ``MAX_INT_DIGITS`` digits and only finite numbers (``NaN``, ``Infinity`` and
  overflowing literals such as ``1e999`` are refused; the project never writes
  them), except in data splits, whose validation names the row of such a value;
- an object holds each key once (``{"answer": 1, "answer": 2}`` is refused, not read
  as its last value).

Every failure is ``error(message)`` with one line naming the file, where the
caller picks the error class (RunError for run files, DataError for data).
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from evolve.errors import EvolveError, first_line

MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 64
MAX_INT_DIGITS = 40


class JsonError(EvolveError):
    """Unreadable or unacceptable JSON; one line naming the file."""


def check_regular(path: str | os.PathLike, what: str, error=JsonError, *,
                  where: str | None = None) -> int:
    """Size of ``path`` if it is a regular file (symlinks followed); else ``error``.
    ``where`` names the file in messages (default: the path as given)."""
    name = path if where is None else where
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise error(f"{name}: {what} not found") from None
    except OSError as e:
        raise error(f"{name}: cannot read {what} ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{name}: {what} is not a regular file")
    return st.st_size


def read_capped(path: str | os.PathLike, what: str, limit: int, error=JsonError, *,
                where: str | None = None, head: bool = False) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, read with that cap
    (with ``head``, the first ``limit`` bytes of a file of any size). ``where`` names
    the file in messages (default: the path as given)."""
    size = check_regular(path, what, error, where=where)
    name = path if where is None else where
    if size > limit and not head:
        raise error(f"{name}: {what} is {size} bytes, larger than {limit}")
    try:
        # O_NONBLOCK: should the file be swapped for a FIFO after the check, open
        # returns at once instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise error(f"{name}: cannot read {what} ({e.strerror or e})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{name}: {what} is not a regular file")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + (0 if head else 1) - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total >= limit and head:
                break
            if total > limit:
                raise error(f"{name}: {what} is larger than {limit} bytes")
    except OSError as e:
        raise error(f"{name}: cannot read {what} ({e.strerror or e})") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_text(path: str | os.PathLike, what: str, limit: int, error=JsonError, *,
              where: str | None = None) -> str:
    """A regular file of at most ``limit`` bytes (``read_capped``) as UTF-8 text; a
    byte that is not UTF-8 is ``error`` naming its line."""
    raw = read_capped(path, what, limit, error, where=where)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        name = path if where is None else where
        raise error(f"{name}: line {line}: not UTF-8 text ({e.reason})") from None


def _constant(name: str):
    raise ValueError(f"non-finite number {name} is not allowed")


def _float(text: str) -> float:
    x = float(text)
    if not math.isfinite(x):
        raise ValueError(f"number {text[:20]} is out of range")
    return x


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)


def _unique_keys(pairs: list) -> dict:
    """An object's members, refused when a key appears twice (json keeps the last)."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"key {key[:40]!r} appears twice")
        out[key] = value
    return out


def _too_deep(text: str) -> bool:
    """Whether brackets outside strings nest deeper than MAX_DEPTH (checked before
    parsing, so the limit is the same whatever the caller's stack depth)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return False
    import numpy as np    # lazy: start-up (NumPy loads only where it is used)
    bare = _STRING.sub("", text)
    raw = np.frombuffer(bare.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    step = (np.isin(raw, (ord("["), ord("{"))).astype(np.int64)
            - np.isin(raw, (ord("]"), ord("}"))))
    return bool(step.size) and int(np.cumsum(step).max()) > MAX_DEPTH


def loads(text: str | bytes, where: str, what: str = "JSON", error=JsonError,
          finite: bool = True):
    """Parse JSON text within the limits above; ``where`` names the file (and line).
    ``finite=False`` lets NaN and infinities through (data splits, whose own
    validation then names the field and row of a non-finite value)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{where}: cannot read {what} (not UTF-8 at byte {e.start})") from None
    if _too_deep(text):
        raise error(f"{where}: {what} is nested too deeply (more than {MAX_DEPTH} levels)")
    try:
        if not finite:
            return json.loads(text, parse_int=_int, object_pairs_hook=_unique_keys)
        return json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        at = f"line {e.lineno}: " if "\n" in text.rstrip("\n") else ""
        raise error(f"{where}: {what} is not valid JSON ({at}{e.msg})") from None
    except RecursionError:
        raise error(f"{where}: {what} is nested too deeply") from None
    except ValueError as e:
        raise error(f"{where}: {what} is not valid JSON ({first_line(e)})") from None


def read_json(path: str | os.PathLike, what: str, error=JsonError,
              limit: int = MAX_JSON_BYTES, *, where: str | None = None):
    """A JSON file: regular, at most ``limit`` bytes, parsed by ``loads``.
    ``where`` names the file in messages (default: the path as given)."""
    data = read_capped(Path(path), what, limit, error, where=where)
    return loads(data, str(path) if where is None else where, what, error)
